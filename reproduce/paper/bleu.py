"""The paper's BLEU: Moses-tokenized, compound-split, multi-bleu (Table 2's convention).

The paper scored with tensor2tensor's ``utils/get_ende_bleu.sh``, which runs, on hypotheses and on
a reference file tokenized beforehand in the same way:

1. ``tokenizer.perl -l de`` (Moses; no ``-a``, so hyphens inside words stay attached);
2. ``perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'`` ("rich-text" -> "rich ##AT##-##AT## text"),
   once per file, as in GNMT and ConvS2S's evaluation;
3. ``multi-bleu.perl``: case-sensitive corpus BLEU, 4-grams, no smoothing, one reference.

What we do, and where it differs:

- Step 1 is ``sacremoses.MosesTokenizer(lang)`` with ``escape=False``. tokenizer.perl escapes
  ``& | < > ' " [ ]`` as XML entities by default; that maps one character to one non-space string, so
  neither token boundaries, the hyphen rule nor BLEU change. Later versions of the script also
  normalize Unicode punctuation (``replace-unicode-punctuation.perl``) in the hypotheses only; we
  skip that one-sided step and tokenize hypotheses and raw references identically.
- Step 2 in the script is ONE pass of a regex that consumes the character after the hyphen, so a
  chain is split only at every other hyphen: "a-b-c" -> "a ##AT##-##AT## b-c". Literally running
  the substitution twice does not fix that: the second pass also splits the "#-#" inside
  "##AT##-##AT##". By default we leave the right-hand character unconsumed (a lookahead), which
  gives what repeating the substitution on the text's own hyphens until nothing changes would:
  "a ##AT##-##AT## b ##AT##-##AT## c", and the script's output wherever there is no chain.
  ``split_chains=False`` reproduces the script's single pass exactly. Chains of two or more hyphens
  are rare in news text, so the two differ little; the signature says which was used.
- Step 3 is sacreBLEU on the already tokenized text (``tokenize="none"``, ``smooth_method="none"``),
  whose statistics and formula are multi-bleu.perl's: clipped n-gram counts summed over the corpus,
  geometric mean of the four precisions (any zero precision gives 0), brevity penalty
  exp(1 - r/c) when c < r.
"""

from __future__ import annotations

import re
from functools import lru_cache
from importlib.metadata import version
from typing import TYPE_CHECKING

from sacrebleu.metrics import BLEU, BLEUScore

if TYPE_CHECKING:  # imported when first used: a third of a second a process that never scores
    from sacremoses import MosesTokenizer

KIND = "tokenized-compound-split"
AT_SPLIT = " ##AT##-##AT## "
# As the script's rule, but the lookahead leaves the next character free to start the next match.
_CHAIN_HYPHEN = re.compile(r"(\S)-(?=\S)")
# tensor2tensor's perl substitution as written: consumes the right-hand character.
_SCRIPT_HYPHEN = re.compile(r"(\S)-(\S)")


@lru_cache(maxsize=8)
def _moses(lang: str) -> MosesTokenizer:
    """One tokenizer per language: building one loads its non-breaking prefixes."""
    from sacremoses import MosesTokenizer

    return MosesTokenizer(lang)


def moses_tokenize(lines: list[str], lang: str) -> list[str]:
    """Moses tokenization (tokenizer.perl -l lang, without -a), tokens joined by single spaces."""
    tokenizer = _moses(lang)
    return [tokenizer.tokenize(line, escape=False, return_str=True) for line in lines]


def split_compounds(line: str, split_chains: bool = True) -> str:
    """Hyphenated compounds as ``a ##AT##-##AT## b``; ``split_chains=False`` is the script's single
    pass, which leaves every second hyphen of a chain attached."""
    if split_chains:
        return _CHAIN_HYPHEN.sub(r"\1" + AT_SPLIT, line)
    return _SCRIPT_HYPHEN.sub(r"\1" + AT_SPLIT + r"\2", line)


def _multi_bleu_metric() -> BLEU:
    # force=True: the input is tokenized on purpose; sacreBLEU would otherwise warn about it.
    return BLEU(tokenize="none", smooth_method="none", force=True)


def multi_bleu(hypotheses: list[str], references: list[str]) -> BLEUScore:
    """multi-bleu.perl on whitespace-tokenized lines (4-gram, case-sensitive, unsmoothed, 1 ref).

    The returned score carries the counts (``counts``, ``totals``, ``sys_len``, ``ref_len``)."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    return _multi_bleu_metric().corpus_score(hypotheses, [references])


def signature(lang: str, split_chains: bool = True) -> str:
    """Names every step and version, so a score can never be mistaken for sacreBLEU."""
    split = "chains-split" if split_chains else "t2t-single-pass"
    return (f"tok:moses-{lang}-no-escape|compound:##AT##-##AT##,{split}|"
            f"bleu:multi-bleu-4gram|case:mixed|smooth:none|nrefs:1|"
            f"sacremoses:{version('sacremoses')}|sacrebleu:{version('sacrebleu')}")


def tokenized_bleu(hypotheses: list[str], references: list[str], lang: str,
                   split_chains: bool = True) -> dict:
    """The paper's BLEU on detokenized hypotheses and raw references, labelled with its kind and
    signature (compare: ``reproduce.train.evaluate.sacre_bleu``, kind ``sacrebleu``)."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    hyp = [split_compounds(line, split_chains) for line in moses_tokenize(hypotheses, lang)]
    ref = [split_compounds(line, split_chains) for line in moses_tokenize(references, lang)]
    score = multi_bleu(hyp, ref)
    return {"kind": KIND, "score": round(score.score, 2),
            "signature": signature(lang, split_chains), "sentences": len(hypotheses)}
