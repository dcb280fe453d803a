"""How many tokens a pass would a draft copied from the context give the decode? (real weights; no timing)

A plain decode takes one token a pass through the model, and on the small shapes a pass is a latency chain,
not a byte stream (PERF.md). A draft of the next k tokens copied from the context (the tokens that followed
the latest earlier occurrence of the context's last n tokens, the longest n from --ngram down to --min-match
that occurs) lets one pass over k + 1 positions keep every draft token up to the first the model would not have
picked, plus the model's own next token. Greedy tokens do not depend on the drafts, so one greedy decode a prompt gives the
exact number of passes for every k. Coding agents copy a lot (SEARCH blocks, whole-file rewrites, tests that
quote the code); prose copies little: the prompts below hold both.

    python bench/lookup_acceptance.py [--model NAME] [--device cpu|cuda] [--tokens 256] [--drafts 2,4,8]
    python bench/lookup_acceptance.py --device cuda --positions 5   # and the CUDA decode's drafted passes, timed
    python bench/lookup_acceptance.py --device cuda --positions 5 --define KOG_GATHER_TO_XS=8   # another build
    python bench/lookup_acceptance.py --device cuda --positions 5 --rules 4:4,3:3   # switching rules side by side

For each prompt it prints the tokens a pass for each k, and for k = 4 the share of passes that had a draft
and the share whose draft lost its first token (a pass that a plain decode would have run anyway).
With --positions N (CUDA), each prompt is decoded again with N positions a pass (N - 1 drafts), by the drafts'
build throughout and switching builds (engine/drafts.py; --rules times several (COPY_MATCH, DRY_PASSES) rules
in one process): the tokens must be the plain decode's, and the decode rates (the kernel's own token stamps) are
printed side by side.
"""

from __future__ import annotations

import argparse
import contextlib
import re

import numpy as np

from agent.workloads import PROMPTS
from bench.random_models import as_the_gpu_holds
from engine import drafts
from engine.api import load
from engine.backends import create_backend
from engine.drafts import MIN_MATCH, NGRAM, BuildSwitch, ContextDrafts
from engine.session import Session
from engine.sampling import SamplingParams


def passes(prompt: list[int], generated: list[int], k: int, ngram: int = NGRAM, min_match: int = MIN_MATCH) -> tuple[int, int, int]:
    """(passes, passes with a draft, passes whose draft's first token was wrong) to decode `generated`."""
    n = replay(prompt, generated, k + 1, None, ngram, min_match)
    return n["without"] + n["drafted"], n["drafted"], n["missed"]


@contextlib.contextmanager
def switching_rule(rule: tuple[int, int] | None):
    """engine/drafts.py's (COPY_MATCH, DRY_PASSES) set to `rule` (None: as they are) for the block, then restored:
    BuildSwitch reads them from the module."""
    saved = drafts.COPY_MATCH, drafts.DRY_PASSES
    if rule:
        drafts.COPY_MATCH, drafts.DRY_PASSES = rule
    try:
        yield
    finally:
        drafts.COPY_MATCH, drafts.DRY_PASSES = saved


def replay(prompt: list[int], generated: list[int], positions: int, rule: tuple[int, int] | None,
           ngram: int = NGRAM, min_match: int = MIN_MATCH) -> dict[str, int]:
    """The passes a drafted decode of `generated` takes, by kind: plain tokens, the drafts' build's passes without a
    draft, with one (`drafted`; `missed`: their first draft token was wrong), and the switches between the builds.
    The drafts' build throughout (`rule` None), or switching builds as engine/drafts.py's BuildSwitch says under
    (COPY_MATCH, DRY_PASSES) = `rule`, from the plain build. A switch leaves one pass after the pass whose token decided
    it, as the engine's does: the host sees that token while the next pass runs, and the kernel reads the host's cancel
    at a pass's final norm (kernels/decode.cu; assuming the host queues the other build within a pass's layers)."""
    context, done = ContextDrafts(prompt, ngram, min_match), 0
    counts = dict(plain=0, without=0, drafted=0, missed=0, switches=0)
    drafting = rule is None
    switch = BuildSwitch(ContextDrafts(prompt, ngram, min_match), positions) if rule else None
    decided = False  # BuildSwitch said to leave: the launch ends after the pass that runs next
    with switching_rule(rule):
        if rule:
            switch.start(drafting=False)
        while done < len(generated):
            guess = context.draft(positions - 1) if drafting else []
            kept = kept_of(guess, generated, done)
            step = min(kept + 1, len(generated) - done)  # the kept drafts and the pass's own token
            counts["drafted" if guess else "without" if drafting else "plain"] += 1
            counts["missed"] += bool(guess) and kept == 0
            leave = [switch.seen(t) for t in generated[done : done + step]][-1] if rule else False
            context.extend(generated[done : done + step])
            done += step
            if done < len(generated) and decided:
                drafting, decided = not drafting, False
                switch.start(drafting)
                counts["switches"] += 1
            elif leave:
                decided = True
    return counts


def kept_of(guess: list[int], generated: list[int], done: int) -> int:
    """How many tokens of a pass's draft `guess` the model keeps, the pass starting at generated[done]: those up to
    the first it would not have chosen."""
    kept = 0
    while kept < len(guess) and done + kept < len(generated) and guess[kept] == generated[done + kept]:
        kept += 1
    return kept


def parse_rules(text: str) -> list[tuple[int, int]]:
    """"COPY:DRY,..." as (COPY_MATCH, DRY_PASSES) pairs; ValueError unless COPY is a match length the draft rule can
    report (MIN_MATCH .. NGRAM: past NGRAM the plain build would never hand over) and DRY is at least 1."""
    if not re.fullmatch(r"\d+:\d+(,\d+:\d+)*", text):
        raise ValueError("--rules takes COPY:DRY pairs of integers, comma-separated")
    rules = [(int(c), int(d)) for c, d in (rule.split(":") for rule in text.split(","))]
    if any(not MIN_MATCH <= c <= NGRAM or d < 1 for c, d in rules):
        raise ValueError(f"--rules: COPY runs from {MIN_MATCH} to {NGRAM}, DRY from 1")
    return rules


def greedy_reply(model, backend, system: str | None, text: str, tokens: int) -> tuple[list[int], list[int]]:
    """(prompt, reply): the chat prompt of `text` after `system`, and its greedy reply of at most `tokens` tokens,
    decoded by `backend` from an empty cache."""
    backend.truncate(0)
    session = Session(model, backend, system=system)
    prompt = model.tokenizer.encode_chat(session.conversation() + [{"role": "user", "content": text}], add_generation_prompt=True)
    return prompt, [event.id for event in session.send(text, SamplingParams(), max_tokens=tokens)]


def decode_rate(backend) -> float:
    """Tokens a second of the last decode, from the kernel's own token stamps (first to last token)."""
    t = backend.token_times_ns.astype(np.float64)
    return (len(t) - 1) / ((t[-1] - t[0]) * 1e-9) if len(t) > 1 else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--drafts", default="2,4,8")
    parser.add_argument("--ngram", type=int, default=NGRAM)
    parser.add_argument("--positions", type=int, default=1, help="CUDA: also decode with this many positions a pass")
    parser.add_argument("--min-match", type=int, default=MIN_MATCH, help="a draft needs this many of the last tokens matched")
    parser.add_argument("--define", action="append", default=[], metavar="KOG_X=N",
                        help="CUDA: a kernel build knob (kernels/decode_common.cuh), repeatable")
    parser.add_argument("--rules", default=f"{drafts.COPY_MATCH}:{drafts.DRY_PASSES}", metavar="COPY:DRY,...",
                        help="CUDA: the switching rules to time (engine/drafts.py's COPY_MATCH and DRY_PASSES)")
    args = parser.parse_args()
    if any(not re.fullmatch(r"KOG_\w+=-?\d+", d) for d in args.define):
        parser.error("--define takes KOG_NAME=INTEGER")
    try:
        rules = parse_rules(args.rules)
    except ValueError as e:
        parser.error(str(e))
    ks = [int(k) for k in args.drafts.split(",")]
    model = load(args.model) if args.device == "cuda" else as_the_gpu_holds(load(args.model))  # (the GPU's replies)
    totals = {k: [0, 0] for k in ks}
    print(f"{model.name}, greedy, {args.tokens} tokens at most, drafts of the last {args.ngram}-gram down to {args.min_match}")
    defines = dict(d.split("=", 1) for d in args.define)
    if args.min_match != MIN_MATCH:  # (the kernel's rule, a build knob)
        defines["KOG_DRAFT_MIN_MATCH"] = str(args.min_match)
    if defines and args.device == "cuda":
        from engine.backends.cuda import CudaBackend

        backend = CudaBackend(model, 4096, defines=defines)
    else:
        backend = create_backend(model, args.device, 4096)
    rates = []
    for name, (system, text) in PROMPTS.items():
        prompt, generated = greedy_reply(model, backend, system, text, args.tokens)
        if args.positions > 1:
            plain = decode_rate(backend)
            backend.draft_positions = args.positions
            positions = backend.pass_positions  # (fewer where that many do not fit the GPU's shared memory)
            timed = [plain]
            for rule in [None] + rules:  # the drafts' build throughout, then in stretches with the plain build
                backend.truncate(0)
                backend.switch_builds = rule is not None
                with switching_rule(rule):
                    drafted = [event.id for event in Session(model, backend, system=system).send(text, SamplingParams(), max_tokens=args.tokens)]
                timed.append(decode_rate(backend))
                print(f"{name:8s} CUDA decode, {positions} positions a pass{f', switching builds {rule}' if rule else ''}: "
                      f"{timed[-1]:7.1f} tok/s ({timed[-1] / plain:.2f}x plain's {plain:.1f}), "
                      f"{backend.last_status['passes']} passes, {backend.last_status['launches']} launches, "
                      f"tokens {'identical' if drafted == generated else 'DIFFERENT'}")
            backend.draft_positions = 1
            rates.append(timed)
        row = []
        for k in ks:
            count, drafted, missed = passes(prompt, generated, k, args.ngram, args.min_match)
            totals[k][0] += len(generated)
            totals[k][1] += count
            row.append(f"k={k} {len(generated) / count:.2f}")
            if k == 4:
                shares = f"drafted {drafted / count:.0%}, first token wrong {missed / count:.0%}"
        print(f"{name:8s} prompt {len(prompt):4d}, generated {len(generated):3d}: tokens a pass " + ", ".join(row)
              + (f"; k=4 passes {shares}" if 4 in ks else ""))
    print("all: tokens a pass " + ", ".join(f"k={k} {t / c:.2f}" for k, (t, c) in totals.items()))
    if rates:
        print(f"CUDA decode, {args.positions} positions a pass against plain: "
              + ", ".join(f"{row[1] / row[0]:.2f}x" for row in rates))
        for i, rule in enumerate(rules, 2):
            print(f"CUDA decode, {args.positions} positions a pass switching builds {rule} against plain: "
                  + ", ".join(f"{row[i] / row[0]:.2f}x" for row in rates))


if __name__ == "__main__":
    main()
