"""The run record (``results/<table>/<run_id>.json``) as one typed definition.

Code reads records by key (``record["metrics"]["dev_ppl"]``); these ``TypedDict``s say which keys
exist, what they hold and which every record has, so a reader (and a type checker) need not
reconstruct them from ``train.runner.run_here``, which writes them. ``SCHEMA_VERSION`` goes into
every new record; a record without ``schema`` is version 1 (the same keys: the version counts
changes from here on). Keys only some records carry (older runs, other tasks) are not required.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, TypedDict, get_args, get_type_hints

if TYPE_CHECKING:
    from reproduce.config import Config

SCHEMA_VERSION = 2


class Metrics(TypedDict, total=False):
    """Headline numbers: translation (BLEU) or parsing (F1) plus what every run has."""

    dev_ppl: float
    dev_nll: float
    train_sample_nll: float  # the same weights on a sample of training pairs (fit against dev)
    dev_bleu: float  # sacreBLEU, detokenized
    test_bleu: float
    dev_bleu_tokenized: float  # the paper's convention (paper.bleu)
    test_bleu_tokenized: float
    dev_chrf: float  # sacreBLEU's chrF, detokenized
    test_chrf: float
    dev_f1: float
    dev_precision: float
    dev_recall: float
    test_f1: float
    test_precision: float
    test_recall: float
    dev_f1_free: float  # parsing decoded without the tree constraint, repaired
    test_f1_free: float
    params: int
    train_steps: int
    train_seconds: float
    train_cpu_seconds: float


# A metric read by a name held in a variable (``record["metrics"][key]``): the type checker checks
# the name only when it is one of these (tests/test_types.py keeps the list equal to Metrics's keys).
MetricName = Literal["dev_ppl", "dev_nll", "train_sample_nll", "dev_bleu", "test_bleu",
                     "dev_bleu_tokenized", "test_bleu_tokenized", "dev_chrf", "test_chrf",
                     "dev_f1", "dev_precision", "dev_recall", "test_f1", "test_precision",
                     "test_recall", "dev_f1_free", "test_f1_free", "params", "train_steps",
                     "train_seconds", "train_cpu_seconds"]
METRIC_NAMES: tuple[MetricName, ...] = get_args(MetricName)


class DataSummary(TypedDict, total=False):
    corpus: str
    train_pairs: int
    dropped_train_pairs: int
    dev_pairs: int
    train_sample_pairs: int
    test_pairs: int
    vocab_size: int
    sha256: str  # of the sentence pairs
    vocab_sha256: str
    vocabulary: dict[str, Any]  # its kind, and how many dev source words it writes as one token
    reference_ppl: dict[str, Any]  # n-gram models of the same dev pieces
    data_dir: str
    files: dict[str, Any]  # per split: path, size, SHA-256 (a user's own files; a Hub download:
    # its shards with theirs, the repository and the revision, data.hub.Snapshot)
    fingerprint: str  # of the corpus's content: names its BPE model and encoded cache
    encoded: str  # the encoded corpus's cache folder (reproduce.data.encoded_cache)
    loader_workers: int  # DataLoader processes that collated the training batches


class Batch(TypedDict, total=False):
    accelerator: str
    strategy: str
    devices: int  # per node
    nodes: int
    world_size: int
    accumulate: int
    device_batch_tokens: int
    effective_tokens_per_step: int
    measured_tgt_tokens_per_step: int  # real target tokens (not padding) a step, over devices
    padded_tgt_tokens_per_step: int  # as the batches' tensors held them, padding included
    tgt_padding_share: float  # 1 - real / padded
    shapes_per_epoch: int  # distinct batch shapes of an epoch's training batches, this rank's
    padding_share: float  # their padding share, both sides (data.batching.shape_census)
    micro_batch_choice: dict[str, Any]  # how `device_batch_tokens: auto` chose (micro_batch)
    step_census: dict[str, Any]  # one steady step's ops, kernels, host waits (step_census)


class Cost(TypedDict, total=False):
    """Training cost two ways (Table 2's columns): the paper's method and counted FLOPs."""

    paper_method_flops: float | None
    device: str
    devices: int
    gpu_shared_by: int
    tflops_per_device: float | None
    tflops_source: str
    analytic_flops: float
    train_hours: float


class Commit(TypedDict, total=False):
    """The code that made a record (``util.machine.commit``). A copied tree that named its commit
    also has the key "from" (``util.machine.COMMIT_ENV``; a keyword, so not declared here)."""

    sha: str | None  # None: not run from a git checkout
    dirty: bool | None  # None: not known (no git checkout)
    version: str  # the package's (reproduce.__version__); older records lack it
    provenance: str  # without a git checkout: "unknown: not run from a git checkout"
    source_sha256: str  # then: the package's Python files (util.machine.source_sha256)


class TrainedBy(TypedDict):
    """The finished run whose training this run evaluated (``records.sharing``)."""

    table: str
    run_id: str
    record: str
    commit: Commit | None


class BleuScore(TypedDict, total=False):
    """One BLEU convention's score of a split (``paper.bleu``), or its chrF."""

    kind: str  # sacrebleu | tokenized-compound-split | chrf
    score: float
    sentences: int
    signature: str
    verbose: str  # sacreBLEU's line: n-gram precisions, brevity penalty, lengths


class Example(TypedDict):
    source: str
    reference: str
    output: str


class SplitBleu(TypedDict, total=False):
    """A split's BLEU: both conventions, chrF, a few examples, and the kept outputs' paths."""

    sacrebleu: BleuScore
    tokenized: BleuScore
    chrf: BleuScore
    examples: list[Example]
    # hypotheses, references, evidence (each sentence's statistics and NLL): paths under the
    # table's folder (records.store.write_outputs, write_evidence)
    outputs: dict[str, str]


class Curve(TypedDict, total=False):
    """Learning curve points, [step, seconds of training, value]."""

    train_loss: list[list[float]]
    dev_ppl: list[list[float]]


class Hardware(TypedDict, total=False):
    """The machine a run trained or was evaluated on (``util.machine.hardware``)."""

    cpu: str
    cpu_flags: list[str]
    cpu_count: int
    torch_threads: int
    torch: str
    python: str
    gpus: list[str]
    load_average: list[float]


class WandbRun(TypedDict, total=False):
    """Where the run's W&B run is: its folder relative to the runs root (``util.tracking``)."""

    id: str
    mode: str  # online | offline | disabled
    dir: str | None
    url: str | None


class _Required(TypedDict):
    run_id: str
    config: dict[str, Any]  # config.Config.to_dict(): the resolved config
    metrics: Metrics


class Record(_Required, total=False):
    """One finished run. Written once, atomically, by ``train.runner``; never edited."""

    schema: int  # SCHEMA_VERSION when written; absent: 1
    modules: dict[str, dict[str, str]]  # model.modules: each file's sha256 and source
    table: str
    row: str
    variant: str
    scale: str
    seed: int
    split: str  # the split the table reports (dev for Table 3)
    scale_overrode: dict[str, Any]  # what the scale replaced of the spec's base
    precision: str
    precision_choice: dict[str, Any]  # how `auto` chose (train.precision)
    compile: bool  # whether training went through torch.compile (train.compile)
    compile_choice: dict[str, Any]  # how: the config, or `auto`'s timings (train.compiling)
    bleu: dict[str, SplitBleu]  # per split
    evalb: dict[str, Any]  # per split (Table 4)
    treebank: dict[str, Any]  # which treebank and sections (Table 4)
    paper: dict[str, Any]  # the paper's figures for this variant, from the spec
    data: DataSummary
    batch: Batch
    averaged_checkpoints: list[str]  # the checkpoints whose weights were scored (one: picked)
    pick: dict[str, Any]  # the weights chosen on dev (train.pick): every candidate's dev score
    curve: Curve
    cost: Cost
    resumed: bool
    resumed_from: Any
    commit: Commit
    hardware: Hardware
    worker: str
    wall_seconds: float
    phases: dict[str, float]  # seconds of this process's phases: (compile_choice,) data, fit,
    # average or pick, dev_ppl, decode
    command: str
    finished_at: str
    wandb: WandbRun
    trained_by: TrainedBy  # set when the training is another run's (records.sharing)
    evaluated_on: Hardware  # where this run was evaluated, when another trained it
    tuning: dict[str, Any]  # how --tune chose the settings
    set: dict[str, Any]  # --set on the command line, over the spec and scale


def config_of(record: Record) -> Config:
    """The record's resolved config as the typed ``Config`` (``Config.from_dict``): readers take
    its fields by name (``config_of(r).train.train_steps``), so a renamed field fails the type
    checker, not a table."""
    from reproduce.config import Config  # config.py is below runs/; kept out of import time

    return Config.from_dict(record["config"])


REQUIRED = tuple(sorted(Record.__required_keys__))
_TYPES = get_type_hints(Record)


def _base(hint: Any) -> tuple[type, ...]:
    """The runtime types a JSON value of ``hint`` may have (TypedDicts are dicts)."""
    origin = getattr(hint, "__origin__", None)
    if hint is Any:
        return (object,)
    if origin is not None and str(origin) == "typing.Union" or type(hint).__name__ == "UnionType":
        return tuple(t for arg in hint.__args__ for t in _base(arg))
    if isinstance(hint, type) and issubclass(hint, dict) or hasattr(hint, "__required_keys__"):
        return (dict,)
    if origin in (dict, list):
        return (origin,)
    if hint is float:
        return (int, float)  # JSON writes 3.0 as 3
    if hint is type(None):
        return (type(None),)
    return (hint,)


def problems(record: dict[str, Any]) -> list[str]:
    """What keeps ``record`` from being a ``Record``: missing required keys, or a known key whose
    value has another type. Unknown keys are allowed (a newer writer's)."""
    out = [f"it needs the key {key!r}" for key in REQUIRED if key not in record]
    for key, value in record.items():
        if key in _TYPES and not isinstance(value, _base(_TYPES[key])):
            out.append(f"{key!r} is a {type(value).__name__}, not {_TYPES[key]}")
    return out
