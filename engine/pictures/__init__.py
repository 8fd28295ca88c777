"""Pictures as they cross every boundary: `PictureRef` (ref), checked picture files (file) and the
content-addressed picture store (store). Torch-free.
May import: platform."""
