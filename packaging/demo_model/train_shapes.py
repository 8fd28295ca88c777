"""Train "Parley Shapes", the tiny built-in vision-language model Parley ships with.

A LLaVA model (a small LeViT vision tower + a small Llama), a byte-level BPE tokenizer trained here,
a LlavaProcessor and a chat template, trained on the synthetic world of
shapes_world.py + shapes_data.py (pictures of any size and aspect ratio, shapes
anywhere, noise, blur, JPEG; photos and screenshots from shapes_unknown.py get a one-line
"I can only describe simple shapes" answer), written to resources/models/parley-shapes/ with
save_pretrained. Every picture goes through the model's own image processor, as in the app.
Nothing is downloaded.

Recipe:
  stage 1  the vision tower and projector alone learn to see: a training-only linear probe
           reads each 3x3 cell's 2x2 picture tokens (RMS-normalised, as the language model sees them) and
           predicts the shape kind, colour (or empty) and the cell; the mean token predicts the
           background. A curriculum: --easy-steps of one large clean shape (shapes_world.lesson_scene),
           then the full mix blended in over as many steps again.
  stage 2  the whole model on conversations exactly as the app renders them:
           processor.apply_chat_template(messages) -> processor(text=..., images=...); loss on the
           assistant answers only (each followed by EOS); the probe
           keeps running (so the picture tokens stay readable), and a second probe asks the
           picture tokens, two layers into the language model, which picture they belong to
           (shapes_probes.py); the vision tower starts frozen, then learns at a lower rate.
Start points: from scratch (tokenizer and language model too); --lm-from FOLDER: a trained folder's
tokenizer and language model with a new vision side (how the shipped weights were made: see the
model README for the command); --init FOLDER: fine-tune a folder of this architecture as it is.

    .venv/bin/python packaging/demo_model/train_shapes.py            # full run from scratch
    .venv/bin/python packaging/demo_model/train_shapes.py --vision-steps 50 --steps 50 --out /tmp/shapes-smoke

Reproducible: the same seed, steps, batch sizes, thread count (and start folder) give the same weights.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # the repo root: engine.platform.paths
import shapes_data as sd  # noqa: E402
import shapes_questions as questions  # noqa: E402
import shapes_replies as replies  # noqa: E402
import shapes_world as world  # noqa: E402
from shapes_probes import CellHead, PictureOrderProbe, WordProbe, lm_view, pointing_loss  # noqa: E402

from engine.platform.paths import DEMO_MODEL  # noqa: E402

DEFAULT_OUT = DEMO_MODEL  # where the app looks for its built-in model

IMAGE_SIZE = 96
GRID = 6  # 6 x 6 = 36 picture tokens, 2 x 2 for each cell of the world's 3 x 3 grid
VISION_DIM = 128  # width of the picture tokens the vision tower hands the projector
VOCAB_SIZE = 640


@dataclass(frozen=True)
class LanguageModelShape:
    """The Llama language model's size (from scratch only; --init and --lm-from keep their folder's)."""

    layers: int = 4
    width: int = 192
    ffn: int = 512
    heads: int = 4


# ---------------------------------------------------------------- tokenizer and processor


def build_tokenizer(seed: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(seed)
    corpus = sd.tokenizer_corpus(rng)
    # the small-talk lines are rare in the corpus above; repeat them so they become whole words
    for prompts, reply in replies.SMALLTALK:
        corpus += (prompts + [p.capitalize() for p in prompts] + [reply]) * 20
    corpus += (
        replies.OFF_TOPIC_FIXED
        + [replies.OFF_TOPIC_REPLY, replies.NO_PICTURE_REPLY, replies.ONE_PICTURE_REPLY, replies.UNKNOWN_REPLY]
        + replies.SYSTEM_PROMPTS
    ) * 20
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=sd.SPECIAL_TOKENS,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        extra_special_tokens={"image_token": "<image>"},
        model_max_length=2048,
    )


def build_processor(tokenizer):
    from transformers import CLIPImageProcessor, LlavaProcessor

    ip = CLIPImageProcessor(
        size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        do_center_crop=False,
    )  # squash, don't crop: a shape near the edge stays in the picture
    # patch_size here only counts picture tokens: 96 / 16 = 6 per side, all kept ("full": no CLS token)
    return LlavaProcessor(
        image_processor=ip,
        tokenizer=tokenizer,
        patch_size=IMAGE_SIZE // GRID,
        vision_feature_select_strategy="full",
        num_additional_image_tokens=0,
        chat_template=sd.CHAT_TEMPLATE,
    )


def build_model(processor, lm=LanguageModelShape()):
    """A from-scratch LLaVA with a language model of shape `lm` (a LanguageModelShape). Unannotated:
    mypy would check the body against the config classes' stubs, which lack keyword arguments
    these configs take."""
    from transformers import LevitConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    tok = processor.tokenizer
    # LeViT: a convolutional stem (four stride-2 convolutions: 96 px -> 6x6) and attention blocks with
    # learned relative-position biases. Its convolutions see a shape the same wherever it sits, which
    # a plain ViT with 32-px (or 16-px) patches had to learn from examples and, on this CPU's budget,
    # did not (shape kind stayed at chance).
    # LLaVA reads hidden_states[1], the 6x6 output of the first stage: its subsample to 3x3 is
    # switched off (down_ops), as a 3x3 picture could not tell a shape near a third's line from one
    # over it. The later two stages, which LeViT's config always has, are kept minimal and unread.
    # hidden_size sizes LLaVA's projector.
    vision = LevitConfig(
        image_size=IMAGE_SIZE,
        hidden_sizes=[VISION_DIM, VISION_DIM, 16],
        num_attention_heads=[4, 4, 1],
        depths=[4, 0, 0],
        key_dim=[16, 16, 16],
        mlp_ratio=[2, 2, 2],
        attention_ratio=[2, 2, 2],
        output_hidden_states=True,
        hidden_size=VISION_DIM,
    )
    vision.down_ops[0] = [""]
    text = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=lm.width,
        intermediate_size=lm.ffn,
        num_hidden_layers=lm.layers,
        num_attention_heads=lm.heads,
        num_key_value_heads=lm.heads,
        max_position_embeddings=2048,
        rope_theta=10000.0,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    cfg = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=processor.image_token_id,
        vision_feature_select_strategy="full",
        vision_feature_layer=1,
        projector_hidden_act="gelu",
        image_seq_length=GRID**2,
        tie_word_embeddings=True,
    )
    model = LlavaForConditionalGeneration(cfg)
    model.generation_config.bos_token_id = tok.bos_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.do_sample = False
    model.generation_config.max_new_tokens = 64
    return model


def _hidden_size(sub_config: object) -> int:
    """A built model's sub-config's hidden size (transformers types sub-configs as dict | config | None;
    a model built from configs holds configs)."""
    from transformers import PreTrainedConfig

    if not isinstance(sub_config, PreTrainedConfig):
        raise TypeError(f"expected a model config, got {type(sub_config).__name__}")
    return sub_config.hidden_size


def transplant_language_model(folder: Path, seed: int):
    """A new model (fresh vision tower and projector) speaking with the tokenizer and language model of
    a trained demo folder: the language model already knows the conversations, so the new vision side
    only has to learn to see and to hand it readable picture tokens."""
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    processor = build_processor(tokenizer)
    torch.manual_seed(seed)
    model = build_model(processor)
    old = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
    model.model.language_model.load_state_dict(old.model.language_model.state_dict())
    return tokenizer, processor, model


# ---------------------------------------------------------------- batches


def encode(processor, convs: list[sd.Conversation]) -> dict[str, torch.Tensor]:
    """Render with the chat template, tokenize with the processor, mask all but the answers."""
    texts = [processor.apply_chat_template(c.messages, tokenize=False) for c in convs]
    images = [im for c in convs for im in c.images]
    batch = processor(text=texts, images=images or None, padding=True, return_tensors="pt")
    ids = batch["input_ids"]
    tok = processor.tokenizer
    assistant = tok.convert_tokens_to_ids("<|assistant|>")
    # labels: the tokens after each <|assistant|> up to and including its EOS
    is_start = (ids == assistant).long()
    is_eos = (ids == tok.eos_token_id).long()
    # inside = (#starts so far, exclusive) > (#eos so far, exclusive)
    starts_before = torch.cumsum(is_start, 1) - is_start
    eos_before = torch.cumsum(is_eos, 1) - is_eos
    inside = (starts_before > eos_before) & (batch["attention_mask"] == 1)
    labels = torch.where(inside, ids, torch.full_like(ids, -100))
    batch["labels"] = labels
    return dict(batch)


def check_rendering(processor, rng: random.Random) -> None:
    """The training text must be the app's prompt + answer + EOS, token for token."""
    tok = processor.tokenizer
    for _ in range(50):
        c = sd.random_conversation(rng)
        full = processor.apply_chat_template(c.messages, tokenize=False)
        full_ids = tok.encode(full, add_special_tokens=False)
        assert full_ids[0] == tok.bos_token_id and full_ids.count(tok.bos_token_id) == 1
        k = 0
        for i, m in enumerate(c.messages):
            if m["role"] != "assistant":
                continue
            prompt = processor.apply_chat_template(c.messages[:i], add_generation_prompt=True, tokenize=False)
            answer = m["content"][0]["text"]
            assert full.startswith(prompt + answer + tok.eos_token), (full, prompt)
            p_ids = tok.encode(prompt, add_special_tokens=False)
            a_ids = tok.encode(answer, add_special_tokens=False) + [tok.eos_token_id]
            assert full_ids[: len(p_ids) + len(a_ids)] == p_ids + a_ids
            assert c.answers[k][1] == answer
            k += 1
        enc = encode(processor, [c])
        got = enc["input_ids"][0][enc["labels"][0] != -100].tolist()
        want = []
        for _, a in c.answers:
            want += tok.encode(a, add_special_tokens=False) + [tok.eos_token_id]
        assert got == want


def draft_size(scene: world.Scene, rng: random.Random) -> tuple[int, int] | None:
    """Most training pictures (85%) are drawn at most 128 px long, keeping their aspect ratio: the
    processor squashes every picture to 96x96 anyway, and drawing an 800-px picture took most of a step."""
    w, h = scene.size or (96, 96)
    if max(w, h) <= 128 or rng.random() < 0.15:
        return None
    k = 128 / max(w, h)
    return max(24, round(w * k)), max(24, round(h * k))


def draft_render(scene: world.Scene, rng: random.Random):
    return world.render(scene, rng, draft_size(scene, rng))


def cosine_lr(base: float, warmup: int, total: int, step: int) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return base * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * t)))


def fmt_time(seconds: float) -> str:
    return f"{seconds / 60:4.1f} min"


# ---------------------------------------------------------------- training


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument(
        "--init",
        type=Path,
        default=None,
        help="fine-tune: start from this model folder (its weights, tokenizer and processor)",
    )
    ap.add_argument(
        "--lm-from",
        type=Path,
        default=None,
        help="take the tokenizer and language model of this trained folder; new vision tower",
    )
    ap.add_argument(
        "--probe-warmup",
        type=int,
        default=100,
        help="with --init: stage-1 steps that train only the (new) probes, the model held still",
    )
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--lm-layers", type=int, default=LanguageModelShape.layers, help="from scratch: LM layers")
    ap.add_argument("--lm-width", type=int, default=LanguageModelShape.width, help="from scratch: LM hidden size")
    ap.add_argument("--lm-ffn", type=int, default=LanguageModelShape.ffn, help="from scratch: LM MLP size")
    ap.add_argument("--lm-heads", type=int, default=LanguageModelShape.heads, help="from scratch: LM heads")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--vision-steps", type=int, default=3000, help="stage 1: vision tower + cell probe")
    ap.add_argument(
        "--easy-steps",
        type=int,
        default=400,
        help="stage 1: steps on lesson pictures only; as many again to blend in the full mix",
    )
    ap.add_argument("--vision-batch", type=int, default=48, help="pictures per stage-1 step")
    ap.add_argument("--vision-lr", type=float, default=2e-3)
    ap.add_argument("--steps", type=int, default=4000, help="stage 2: the whole model on conversations")
    ap.add_argument("--batch", type=int, default=24, help="conversations per stage-2 step")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--aux", type=float, default=0.5, help="weight of the cell probe in stage 2")
    ap.add_argument("--order", type=float, default=0.5, help="weight of the picture-order probe in stage 2")
    ap.add_argument("--order-layer", type=int, default=2, help="language-model layer the order probe reads")
    ap.add_argument("--point", type=float, default=0.0, help="weight of the pointing loss (shapes_probes)")
    ap.add_argument("--point-layers", default="2,3", help="language-model layers whose --point-head is taught")
    ap.add_argument("--point-head", type=int, default=0)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument(
        "--freeze-vision",
        type=int,
        default=200,
        help="stage-2 steps with the vision tower frozen (projector and LM catch up first)",
    )
    ap.add_argument(
        "--weight",
        action="append",
        default=[],
        metavar="TYPE=W",
        help="stage 2: how often a question type is asked (default: shapes_questions.WEIGHTS)",
    )
    args = ap.parse_args(argv)
    try:
        weights = questions.parse_weights(args.weight)
    except ValueError as e:
        ap.error(str(e))

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t_start = time.time()

    if args.init:  # fine-tune: the folder's own tokenizer, processor and weights
        from transformers import AutoProcessor, LlavaForConditionalGeneration

        processor = AutoProcessor.from_pretrained(args.init)
        tokenizer = processor.tokenizer
        model = LlavaForConditionalGeneration.from_pretrained(args.init, dtype=torch.float32)
    elif args.lm_from:
        tokenizer, processor, model = transplant_language_model(args.lm_from, args.seed)
    else:
        tokenizer = build_tokenizer(args.seed)
        processor = build_processor(tokenizer)
        model = build_model(processor, LanguageModelShape(args.lm_layers, args.lm_width, args.lm_ffn, args.lm_heads))
    check_rendering(processor, random.Random(args.seed + 1))
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"tokenizer: {len(tokenizer)} tokens; model: {n_params / 1e6:.2f} M parameters "
        f"({n_params * 4 / 2**20:.1f} MiB fp32); {GRID**2} tokens per picture",
        flush=True,
    )
    head = CellHead(_hidden_size(model.config.vision_config), GRID)  # on the vision tower's output
    head_lm = CellHead(_hidden_size(model.config.text_config), GRID)  # on the picture tokens the LM gets
    words = WordProbe(tokenizer, GRID)
    embed = model.get_input_embeddings().weight
    probes = [head, head_lm, words]

    def probe_loss(image_outputs, scenes):
        vis = image_outputs.hidden_states[model.config.vision_feature_layer]  # what the projector reads
        lm = lm_view(torch.stack(list(image_outputs.pooler_output)))
        shapes = [i for i, sc in enumerate(scenes) if not sc.unknown]  # photos/screens have no cells to read
        if len(shapes) < len(scenes):
            vis, lm, scenes = vis[shapes], lm[shapes], [scenes[i] for i in shapes]
        l1, acc = head.loss(vis, scenes)
        l2, _ = head_lm.loss(lm, scenes)
        return l1 + l2 + words.loss(lm, scenes, embed), acc

    model.train()

    # ---- stage 1: teach the vision tower to see (pictures only, cell probe)
    vision = model.model.vision_tower
    projector = model.model.multi_modal_projector
    params = list(vision.parameters()) + list(projector.parameters()) + [p for m in probes for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=args.vision_lr, weight_decay=0.01, betas=(0.9, 0.98))
    rng = random.Random(args.seed + 3)
    acc_ema = None
    t0 = time.time()
    for step in range(args.vision_steps):
        for g in opt.param_groups:
            g["lr"] = cosine_lr(args.vision_lr, 50, args.vision_steps, step)
        for p in vision.parameters() if args.init else ():  # fresh probes first learn to read the model
            p.requires_grad_(step >= args.probe_warmup)
        for p in projector.parameters() if args.init else ():
            p.requires_grad_(step >= args.probe_warmup)
        # a curriculum: one large, clean, centred shape first (kinds are learned there within a few
        # hundred steps; on the full mix, from the start, they were not), then more and more of the full mix
        full_mix = min(1.0, max(0.0, step / args.easy_steps - 1.0)) if args.easy_steps else 1.0  # 0: no lessons
        scenes = [
            world.random_scene(rng) if rng.random() < full_mix else world.lesson_scene(rng)
            for _ in range(args.vision_batch)
        ]
        pictures = [draft_render(sc, rng) for sc in scenes]
        pixels = processor.image_processor(pictures, return_tensors="pt")["pixel_values"]
        loss, acc = probe_loss(model.model.get_image_features(pixel_values=pixels), scenes)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        acc_ema = acc if acc_ema is None else 0.95 * acc_ema + 0.05 * acc
        if (step + 1) % args.log_every == 0 or step + 1 == args.vision_steps:
            el = time.time() - t0
            print(
                f"vision {step + 1:5d}/{args.vision_steps}  probe loss {loss.item():.3f}  "
                f"shape-kind acc {acc_ema:.3f}  {fmt_time(el)}, "
                f"eta {fmt_time(el / (step + 1) * (args.vision_steps - step - 1))}",
                flush=True,
            )

    for p in list(vision.parameters()) + list(projector.parameters()):
        p.requires_grad_(True)
    model.zero_grad(set_to_none=True)  # the word probe left gradients on the (not yet trained) embeddings

    # ---- stage 2: the whole model on conversations rendered as the app renders them
    order = PictureOrderProbe(_hidden_size(model.config.text_config), processor.image_token_id, GRID**2)
    probes.append(order)
    named = [(n, p) for n, p in model.named_parameters()] + [
        (f"aux{i}." + n, p) for i, m in enumerate(probes) for n, p in m.named_parameters()
    ]
    groups: dict[tuple[float, bool], list[torch.nn.Parameter]] = {}  # (weight decay, vision) -> parameters
    for n, p in named:
        wd = 0.05 if (p.ndim >= 2 and "embed" not in n) else 0.0
        groups.setdefault((wd, "vision_tower" in n), []).append(p)
    opt = torch.optim.AdamW(
        [{"params": ps, "weight_decay": wd, "vision": v} for (wd, v), ps in groups.items()],
        lr=args.lr,
        betas=(0.9, 0.98),
        eps=1e-8,
    )
    point_layers = [int(x) for x in args.point_layers.split(",")] if args.point > 0 else []
    if point_layers:  # attention weights are read from the layers; only the eager path returns them
        model.set_attn_implementation("eager")
    data_rng = random.Random(args.seed + 2)
    ema = None
    acc_ema = None
    t0 = time.time()
    t_data = 0.0
    pending: list[list[sd.Conversation]] = []
    for step in range(args.steps):
        td = time.time()
        if not pending:  # draw 4 batches at once and group similar lengths: less padding
            pool = [sd.random_conversation(data_rng, draft_render, weights) for _ in range(4 * args.batch)]
            pool.sort(key=lambda c: (len(c.images), sum(len(str(m["content"])) for m in c.messages)))
            pending = [pool[i * args.batch : (i + 1) * args.batch] for i in range(4)]
            data_rng.shuffle(pending)
        convs = pending.pop()
        batch = encode(processor, convs)
        t_data += time.time() - td
        lr = cosine_lr(args.lr, args.warmup, args.steps, step)
        for g in opt.param_groups:
            # the vision tower, trained in stage 1, waits for the rest to catch up, then learns gently
            g["lr"] = (0.0 if step < args.freeze_vision else 0.5 * lr) if g["vision"] else lr
        out = model(
            **batch, output_hidden_states=args.order > 0, output_attentions=bool(point_layers)
        )  # loss: mean cross-entropy over the answers
        answer_loss = out.loss
        total = answer_loss
        point_loss = torch.zeros(())
        if point_layers:
            point_loss = pointing_loss(
                [out.attentions[i][:, args.point_head] for i in point_layers],
                batch,
                convs,
                processor.image_token_id,
                GRID,
            )
            total = total + args.point * point_loss
        order_loss = torch.zeros(())
        if args.order > 0:
            order_loss = order.loss(out.hidden_states[args.order_layer], batch["input_ids"])
            total = total + args.order * order_loss
        aux_loss = torch.zeros(())
        if args.aux > 0 and "pixel_values" in batch:
            aux_loss, acc = probe_loss(out.image_outputs, [sc for c in convs for sc in c.scenes])
            acc_ema = acc if acc_ema is None else 0.95 * acc_ema + 0.05 * acc
            total = total + args.aux * aux_loss
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss = answer_loss.item()
        ema = loss if ema is None else 0.95 * ema + 0.05 * loss
        if (step + 1) % args.log_every == 0 or step == 0 or step + 1 == args.steps:
            el = time.time() - t0
            print(
                f"chat   {step + 1:5d}/{args.steps}  answer loss {loss:.4f} (avg {ema:.4f})  "
                f"probe {aux_loss.item():.3f} (kind acc {acc_ema or 0:.3f})  "
                f"order {order_loss.item():.3f}  point {point_loss.item():.3f}  lr {lr:.2e}  "
                f"{fmt_time(el)}, eta {fmt_time(el / (step + 1) * (args.steps - step - 1))}  "
                f"(data {100 * t_data / el:.0f}%)",
                flush=True,
            )

    model.eval()
    if point_layers:
        model.set_attn_implementation("sdpa")  # what the app loads it with
    args.out.mkdir(parents=True, exist_ok=True)
    for f in args.out.glob("*"):
        if f.is_file() and f.name != "README.md":
            f.unlink()
    model.save_pretrained(args.out)
    processor.save_pretrained(args.out)
    size = sum(f.stat().st_size for f in args.out.glob("*") if f.is_file())
    print(f"saved to {args.out} ({size / 2**20:.1f} MiB); trained in {fmt_time(time.time() - t_start)}", flush=True)


if __name__ == "__main__":
    main()
