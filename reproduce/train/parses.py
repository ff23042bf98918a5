"""Table 4's scores of a split's parses (``train.evaluate`` decodes them by beam search): every
output repaired into a tree over the input words and scored as EVALB does with COLLINS.prm, where
the parser lost its place (``paper.place``: slots inserted, dropped or substituted, and the
oracle F1 of the realigned trees), and every output kept beside the record, so that F1 can be
scored again from the records alone (``rescore``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reproduce.paper.evalb import evalb
from reproduce.paper.parsing import delinearize, tag_pos, well_formed, words
from reproduce.paper.place import place, realigned
from reproduce.records import store as records


def score_outputs(outputs: Sequence[str], gold: Sequence, linearization: str) -> dict[str, Any]:
    """Labelled bracket P, R, F1 (%) of ``outputs`` (linearized trees as text, one per gold
    tree) repaired over the gold words with the gold POS tags (``delinearize``), how many needed
    no repair, where the slots went (``place``) and the F1 with every slot realigned to its word
    (``oracle_f1``), and the first three as examples."""
    trees = [delinearize(o.split(), words(t), tag_pos(t), linearization)
             for o, t in zip(outputs, gold, strict=True)]
    score = evalb(list(gold), trees)
    oracle = evalb(list(gold), [realigned(o.split(), t, linearization)
                                for o, t in zip(outputs, gold, strict=True)])
    return {"kind": "evalb-collins",
            **{k: round(score[k], 2) for k in ("precision", "recall", "f1")},
            **{k: score[k] for k in ("matched", "gold_brackets", "test_brackets", "sentences")},
            "well_formed": sum(well_formed(o.split(), len(words(t)), linearization)
                               for o, t in zip(outputs, gold, strict=True)),
            "place": {**place(outputs, gold, linearization), "oracle_f1": round(oracle["f1"], 2)},
            "examples": [{"source": " ".join(words(t)), "output": o,
                          "tree": tree.pformat(margin=10**6)}
                         for o, t, tree in list(zip(outputs, gold, trees, strict=True))[:3]]}


def keep(scores: dict[str, Any], outputs: tuple[Path, str] | None, split: str,
         how: str = "") -> dict[str, Any]:
    """``scores`` with its outputs written beside the record (``outputs``: the records folder
    and the run id; ``how``: ``free`` for free decoding) and their path in place of the texts."""
    texts = scores.pop("texts")
    if outputs is not None:
        name = f"{split}.{how}" if how else split
        scores["outputs"] = records.write_lines(*outputs, f"{name}.trees.gz", texts)
    return scores


def rescore(folder: Path, record: dict[str, Any], split: str, gold: Sequence,
            how: str = "") -> dict[str, Any] | None:
    """A parsing record's ``split`` scored again from its kept outputs (``how``: ``free``), or
    None where it keeps none."""
    entry = record.get("evalb", {}).get(split, {})
    entry = entry.get(how, {}) if how else entry
    if not entry.get("outputs"):
        return None
    outputs = records.read_lines(folder, entry["outputs"])
    linearization = record["config"]["data"].get("linearization", "xx")
    return score_outputs(outputs, gold[:len(outputs)], linearization)


def kept_lines(folder: Path, record: dict[str, Any]) -> tuple[list[str], bool]:
    """Whether a parsing record's kept outputs give its scores (``verify``): per split and way
    of decoding, a line, and False where any recorded figure differs from the rescored one."""
    from reproduce.data import treebank_trees

    lines, ok = [], True
    data_dir = record["config"]["data"].get("data_dir") or None
    for split, entry in (record.get("evalb") or {}).items():
        for how, scored in (("", entry), ("free", entry.get("free") or {})):
            name = f"{split}{' (free)' if how else ''}"
            if not scored:
                continue
            try:
                again = rescore(folder, record, split, treebank_trees(split, data_dir), how)
            except records.DamagedRecord as e:
                lines.append(f"outputs of {name}: UNREADABLE ({e})")
                ok = False
                continue
            if again is None:
                lines.append(f"outputs of {name}: none kept (made before parses were kept)")
                continue
            wrong = [k for k in ("precision", "recall", "f1", "well_formed", "place")
                     if k in scored and again[k] != scored[k]]
            ok &= not wrong
            lines.append(f"outputs of {name}: {scored['sentences']} sentences, "
                         + (f"DIFFERENT from the record: {', '.join(wrong)}" if wrong else
                            "rescored to the recorded F1, P, R and place counts"))
    return lines, ok
