"""Training-only probes for "Parley Shapes" (train_shapes.py); none of them is saved.

Each one asks a small linear read-out to find something in the model's activations, so that the
thing is there, in a linear form, for the language model's attention to use: what each picture
cell holds (CellHead, WordProbe) and which picture a picture token belongs to (PictureOrderProbe).
"""

from __future__ import annotations

import math

import shapes_world as world
import torch

BACKGROUND_CLASSES: list[tuple[str, ...]] = [(a,) for a in world.BACKGROUND_NAMES] + [
    (a, b) for a in world.BACKGROUND_NAMES for b in world.BACKGROUND_NAMES if a != b
]


class CellHead(torch.nn.Module):
    """Training-only probe on the picture tokens the language model gets: from the tokens of each 3x3 cell,
    predict which shape and colour (or none) sits there, and which cell it is (the language model
    can't tell a picture token's place from RoPE alone, so the features should carry it); and from
    all tokens, the background.
    It teaches the vision tower to see before the language model learns to look; it is not saved."""

    def __init__(self, dim: int, grid: int):
        super().__init__()
        self.k = grid // 3  # grid = patches per side; the world's 3x3 cells are grid/3 wide
        self.sizes = [len(world.SHAPES) + 1, len(world.COLOUR_NAMES) + 1, 9]
        self.proj = torch.nn.Linear(self.k * self.k * dim, sum(self.sizes))
        self.background = torch.nn.Linear(dim, len(BACKGROUND_CLASSES))  # from the mean token

    def forward(self, feats: torch.Tensor) -> list[torch.Tensor]:
        n, _, d = feats.shape  # (pictures, grid*grid, dim)
        k = self.k
        x = feats.reshape(n, 3, k, 3, k, d).permute(0, 1, 3, 2, 4, 5).reshape(n, 9, k * k * d)
        return list(self.proj(x).split(self.sizes, dim=-1)) + [self.background(feats.mean(1))]

    def loss(self, feats: torch.Tensor, scenes: list[world.Scene]) -> tuple[torch.Tensor, float]:
        """Summed cross-entropy of the three probes; and the shape-kind accuracy on filled cells."""
        kinds, colours = [], []
        for scene in scenes:
            k, col = [0] * 9, [0] * 9
            for o in scene.objects:
                k[o.cell] = 1 + world.SHAPES.index(o.kind)
                col[o.cell] = 1 + world.COLOUR_NAMES.index(o.colour)
            kinds.append(k)
            colours.append(col)
        targets = [
            torch.tensor(kinds),
            torch.tensor(colours),
            torch.arange(9).repeat(len(scenes), 1),
            torch.tensor([BACKGROUND_CLASSES.index(tuple(sc.background)) for sc in scenes]),
        ]
        logits = self(feats)
        ce = torch.nn.functional.cross_entropy
        first, *rest = (ce(lg.reshape(-1, lg.shape[-1]), t.reshape(-1)) for lg, t in zip(logits, targets, strict=True))
        loss = sum(rest, start=first)  # a Tensor from the start (sum's 0 + first is the same value)
        with torch.no_grad():
            filled = targets[0] > 0
            acc = (logits[0].argmax(-1) == targets[0])[filled].float().mean().item()
        return loss, acc


class WordProbe(torch.nn.Module):
    """Training-only: every picture token a shape covers (as the language model sees it) should
    point the way of the word embeddings of the shape's colour, kind and place (" red", " circle",
    " top", " left"). With tied input/output embeddings, answering is then close to copying a word
    from the context, which a small language model learns much sooner than an arbitrary read-out.
    The place words are the shape's, not the token's: a shape centred just right of a third's
    line also covers tokens left of it, and when only the centre token said "middle" the language
    model, attending to all of the shape's tokens, often answered "left" (the centre token alone
    read its cell's column and row 100% right under a linear probe; places were the describe
    answers' main error)."""

    ROWS = ["top", "middle", "bottom"]  # a cell's row and column as the answers name them
    COLUMNS = ["left", "middle", "right"]
    # token ids of those words, registered as buffers in __init__ (nn.Module's __getattr__ types them loosely)
    colour_ids: torch.Tensor
    kind_ids: torch.Tensor
    row_ids: torch.Tensor
    column_ids: torch.Tensor

    def __init__(self, tokenizer, grid: int):
        super().__init__()
        self.grid = grid
        ids = lambda words: torch.tensor([tokenizer.convert_tokens_to_ids("\u0120" + w) for w in words])  # noqa: E731
        self.register_buffer("colour_ids", ids(world.COLOUR_NAMES), persistent=False)
        self.register_buffer("kind_ids", ids(world.SHAPES), persistent=False)
        self.register_buffer("row_ids", ids(self.ROWS), persistent=False)
        self.register_buffer("column_ids", ids(self.COLUMNS), persistent=False)
        self.scale = torch.nn.Parameter(torch.tensor(5.0))

    def loss(self, feats: torch.Tensor, scenes: list[world.Scene], embed: torch.Tensor) -> torch.Tensor:
        idx, objects = [], []
        for i, scene in enumerate(scenes):
            for token, o in covered_tokens(scene, self.grid).items():
                idx.append(i * feats.shape[1] + token)
                objects.append(o)
        colours = [world.COLOUR_NAMES.index(o.colour) for o in objects]
        kinds = [world.SHAPES.index(o.kind) for o in objects]
        rows, columns = [o.cell // 3 for o in objects], [o.cell % 3 for o in objects]
        f = feats.reshape(-1, feats.shape[-1])[torch.tensor(idx)]
        ce = torch.nn.functional.cross_entropy
        scale = self.scale / f.shape[-1] ** 0.5
        loss = torch.zeros(())
        for ids, target in (
            (self.colour_ids, colours),
            (self.kind_ids, kinds),
            (self.row_ids, rows),
            (self.column_ids, columns),
        ):
            e = embed[ids]
            e = e / (e.norm(dim=-1, keepdim=True) + 1e-6)
            loss = loss + ce(f @ e.T * scale, torch.tensor(target))
        return loss


def centre_token(obj: world.Obj, grid: int) -> int:
    """Index of the picture token over a shape's centre (grid is a multiple of 3, so that token
    lies in the shape's cell of the 3x3 grid, the cell its place words name)."""
    r, c = divmod(obj.cell, 3)
    k = grid // 3  # tokens per cell side; clamped into the cell, as the centre may sit on its line
    row = min(max(int(obj.cy * grid), r * k), r * k + k - 1)
    column = min(max(int(obj.cx * grid), c * k), c * k + k - 1)
    return row * grid + column


def covered_tokens(scene: world.Scene, grid: int, reach: float = 0.7) -> dict[int, world.Obj]:
    """The picture tokens each shape covers: its centre token, and every token whose centre lies
    within `reach` of the shape's radius from the shape's centre (the processor squashes the
    picture to a square, so the radius is an ellipse in token units). A token two shapes reach
    belongs to the nearer one; a centre token always to its own shape."""
    w, h = scene.size or (1, 1)
    short = min(w, h)
    owner: dict[int, tuple[float, world.Obj]] = {}
    for o in scene.objects:
        rx, ry = o.half * short / w * reach, o.half * short / h * reach
        for token in range(grid * grid):
            r, c = divmod(token, grid)
            d = math.hypot(((c + 0.5) / grid - o.cx) / rx, ((r + 0.5) / grid - o.cy) / ry)
            if d <= 1 and d < owner.get(token, (math.inf, None))[0]:
                owner[token] = (d, o)
    for o in scene.objects:
        owner[centre_token(o, grid)] = (-1.0, o)
    return {token: o for token, (_, o) in sorted(owner.items())}


def lm_view(feats: torch.Tensor) -> torch.Tensor:
    """Picture tokens as the language model's first layer sees them (RMS-normalised); the probe
    reads them here, so what it demands is there for the language model to read too."""
    return feats * torch.rsqrt(feats.pow(2).mean(-1, keepdim=True) + 1e-6)


class PictureOrderProbe(torch.nn.Module):
    """Training-only: after a few language-model layers, each picture token should say which
    picture of the conversation it belongs to (1st, 2nd, 3rd+), as a class and as a number that
    grows with it. Picture tokens of different pictures look alike, and RoPE only tells distance;
    with the order written into them, "the second picture" and "the latest picture" become a
    lookup the language model's attention can make (without it, two-picture questions mixed the
    pictures up)."""

    MAX = 3

    def __init__(self, dim: int, image_token_id: int, tokens_per_picture: int):
        super().__init__()
        self.image_token_id = image_token_id
        self.per_picture = tokens_per_picture
        self.proj = torch.nn.Linear(dim, self.MAX + 1)  # MAX classes + the number

    def targets(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Where the picture tokens are, and each one's picture (0-based, the last class for 3+)."""
        is_pic = input_ids == self.image_token_id
        order = (torch.cumsum(is_pic.long(), 1) - 1) // self.per_picture  # counted per row
        return is_pic, order[is_pic].clamp(max=self.MAX - 1)

    def loss(self, hidden: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        is_pic, target = self.targets(input_ids)
        if not is_pic.any():
            return torch.zeros(())
        out = self.proj(hidden[is_pic])
        ce = torch.nn.functional.cross_entropy(out[:, : self.MAX], target)
        mse = torch.nn.functional.mse_loss(out[:, self.MAX], target.float())
        return ce + mse


def pointing_loss(
    attentions: list[torch.Tensor], batch: dict[str, torch.Tensor], convs: list, image_token_id: int, grid: int
) -> torch.Tensor:
    """Training-only: while an answer about one shape is written ("Where is the red circle?" ->
    "The red circle is on the left."), the given attention heads ((rows, queries, keys) each) should
    look at that shape's picture tokens (covered_tokens). Of the shipped weights' wrong "where"
    answers about two or three shapes, 26 of 34 named another shape's place: the answer read the
    wrong shape. The loss is -log of the attention mass on the shape, from every position that
    predicts a token of the answer."""
    from shapes_questions import focus_of  # shapes_questions imports nothing from here

    ids, labels = batch["input_ids"], batch["labels"]
    rows, queries, keys = [], [], []
    for b, conv in enumerate(convs):
        pictures = (ids[b] == image_token_id).nonzero().flatten().split(grid * grid)
        answer = labels[b] != -100
        # the answer spans in order: a span starts where a labelled token follows an unlabelled one
        starts = (answer & ~torch.cat([torch.tensor([False]), answer[:-1]])).nonzero().flatten().tolist()
        ends = (answer & ~torch.cat([answer[1:], torch.tensor([False])])).nonzero().flatten().tolist()
        for (qtype, text), about, start, end in zip(conv.answers, conv.about, starts, ends, strict=True):
            if about is None:
                continue
            scene = conv.scenes[about]
            obj = focus_of(scene, qtype, text)
            if obj is None:
                continue
            tokens = [pictures[about][t].item() for t, o in covered_tokens(scene, grid).items() if o is obj]
            for q in range(start - 1, end):  # the positions whose next token is the answer's
                rows.append(b)
                queries.append(q)
                keys.append(tokens)
    if not rows:
        return torch.zeros(())
    mask = torch.zeros(len(rows), ids.shape[1], dtype=torch.bool)
    for i, ks in enumerate(keys):
        mask[i, ks] = True
    r, at = torch.tensor(rows), torch.tensor(queries)
    loss = torch.zeros(())
    for att in attentions:
        mass = (att[r, at] * mask).sum(-1)
        loss = loss + -(mass + 1e-6).log().mean()
    return loss / len(attentions)
