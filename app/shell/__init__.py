"""The window around the rooms: start-up (main: run_app; one instance per data folder; the
display check; the start-up trace), the main window that wires the rooms together, its status bar
and menus (window_chrome) and what the empty chat offers (empty_chat).

Nothing is imported here: `app.run_app` and main.py import main on first use, and main.py asks
display_check before Qt starts.
May import: every room (chat, composer, connection, memory, settings, models, history) and the
root modules; no room imports shell."""
