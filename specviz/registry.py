"""models.yaml: parsing, validation and availability of models and pairs (no loading here)."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .errors import SpecvizError

DEFAULT_REGISTRY = Path(__file__).resolve().parent.parent / "models.yaml"
DRAFTER_FILES = ("weights", "datastore")  # drafter keys that name a file (resolved against models.yaml's folder)


@dataclass(frozen=True)
class Source:
    kind: str  # "package" | "local" | "hub"
    ref: str  # module name, folder path or hub id
    gguf: str | None = None
    revision: str | None = None  # hub: a commit (or branch) to download from
    sha256: str | None = None  # hub GGUF: the file's digest, checked after download

    def resolve(self) -> tuple[str, str | None] | None:
        """(folder or hub id, gguf file) if this source can be loaded without a network, else None."""
        if self.kind == "package":
            spec = importlib.util.find_spec(self.ref)
            if spec is None or not spec.origin:
                return None
            folder = os.path.dirname(spec.origin)
            if self.gguf and not os.path.isfile(os.path.join(folder, self.gguf)):
                return None
            return folder, self.gguf
        if self.kind == "local":
            return (self.ref, self.gguf) if os.path.isdir(self.ref) else None
        if self.gguf:  # a GGUF on the Hub: the file in the local cache, loaded from its folder
            path = _in_hub_cache(self.ref, self.gguf, self.revision)
            return (os.path.dirname(path), self.gguf) if path else None
        return (self.ref, None) if _in_hub_cache(self.ref, "config.json", self.revision) else None

    def describe(self) -> str:
        if self.kind == "package":
            return f"PyPI package {self.ref} ({self.gguf})"
        if self.kind == "local":
            return f"folder {self.ref}"
        return f"hub {self.ref}" + (f" ({self.gguf})" if self.gguf else "")


def _in_hub_cache(repo_id: str, filename: str, revision: str | None = None) -> str | None:
    try:
        from huggingface_hub import try_to_load_from_cache

        path = try_to_load_from_cache(repo_id, filename, revision=revision)
        return path if isinstance(path, str) else None
    except Exception:
        return None


@dataclass(frozen=True)
class ModelSpec:
    name: str
    sources: tuple[Source, ...]
    description: str = ""

    def offline_source(self) -> Source | None:
        return next((s for s in self.sources if s.resolve() is not None), None)

    def pick_source(self) -> Source:
        """The first source usable offline, else the first hub source (needs the network)."""
        src = self.offline_source()
        if src is not None:
            return src
        hub = next((s for s in self.sources if s.kind == "hub"), None)
        if hub is None:
            where = ", ".join(s.describe() for s in self.sources)
            raise SpecvizError(f"model {self.name!r} is not available: none of its sources exist ({where})")
        return hub


@dataclass(frozen=True)
class PairSpec:
    name: str
    target: str
    drafter: dict = field(default_factory=dict)
    gamma: int = 4
    description: str = ""

    @property
    def draft_model(self) -> str | None:
        from .drafters import kind

        return kind(self.drafter.get("kind")).draft_model(self.drafter)


@dataclass
class Registry:
    models: dict[str, ModelSpec]
    pairs: dict[str, PairSpec]
    default_pair: str | None = None

    def model(self, name: str) -> ModelSpec:
        if name not in self.models:
            raise SpecvizError(f"unknown model {name!r}; known: {', '.join(self.models)}")
        return self.models[name]

    def pair(self, name: str) -> PairSpec:
        if name not in self.pairs:
            raise SpecvizError(f"unknown pair {name!r}; known: {', '.join(self.pairs)} "
                               "(python -m specviz pairs lists them)")
        return self.pairs[name]

    def offline(self, pair: PairSpec) -> bool:
        return self.availability(pair) == "offline"

    def availability(self, pair: PairSpec) -> str:
        """"offline", "needs the Hub", or "unavailable: ..." saying what is missing: a drafter's file (a
        trained head's weights, a datastore) not where models.yaml says, or a model with no source at all."""
        missing = [str(v) for k, v in pair.drafter.items() if k in DRAFTER_FILES and v and not Path(v).exists()]
        if missing:
            return "unavailable: " + ", ".join(missing) + " missing"
        models = [self.models[n] for n in [pair.target] + ([pair.draft_model] if pair.draft_model else [])]
        remote = [m for m in models if m.offline_source() is None]
        if not remote:
            return "offline"
        lost = [m.name for m in remote if not any(s.kind == "hub" for s in m.sources)]
        return "unavailable: no source of " + ", ".join(lost) + " exists" if lost else "needs the Hub"

    def ordered_pairs(self) -> list[tuple[PairSpec, bool]]:
        """Default pair first, then the other pairs that work offline, then those needing the Hub."""
        rows = [(p, self.offline(p)) for p in self.pairs.values()]
        default = self.default()
        return sorted(rows, key=lambda r: (r[0].name != default, not r[1]))

    def default(self) -> str:
        if self.default_pair and self.default_pair in self.pairs and self.offline(self.pairs[self.default_pair]):
            return self.default_pair
        for p in self.pairs.values():
            if self.offline(p):
                return p.name
        return self.default_pair or next(iter(self.pairs))


def _source(raw, where: str, base: Path) -> Source:
    if not isinstance(raw, dict):
        raise SpecvizError(f"{where}: a source must be a mapping like {{hub: owner/name}}")
    if "package" in raw:
        return Source("package", str(raw["package"]), raw.get("gguf"))
    if "local" in raw:
        path = Path(os.path.expanduser(str(raw["local"])))
        return Source("local", str(path if path.is_absolute() else base / path), raw.get("gguf"))
    if "hub" in raw:
        extra = {k: raw.get(k) for k in ("gguf", "revision", "sha256")}
        for k, v in extra.items():
            if v is not None and not (isinstance(v, str) and v.strip()):
                raise SpecvizError(f"{where}: {k} must be a non-empty string")
        sha = extra["sha256"]
        if sha is not None and not (len(sha) == 64 and all(c in "0123456789abcdef" for c in sha.lower())):
            raise SpecvizError(f"{where}: sha256 must be 64 hex digits (the GGUF file's SHA-256)")
        if sha is not None and not extra["gguf"]:
            raise SpecvizError(f"{where}: sha256 is checked on a GGUF file: give gguf too")
        return Source("hub", str(raw["hub"]), extra["gguf"], extra["revision"], sha.lower() if sha else None)
    raise SpecvizError(f"{where}: a source needs one of package, local or hub")


def _drafter(spec: dict, where: str, base: Path) -> dict:
    from .drafters import kind

    return kind(spec.get("kind"), where).check(spec, where, base)


def parse(data: dict, base: Path = DEFAULT_REGISTRY.parent, label: str = "models.yaml") -> Registry:
    """A registry from the parsed YAML ``data``; ``label`` names its file in messages."""
    from .engine import MAX_GAMMA

    if not isinstance(data, dict):
        raise SpecvizError(f"{label} must be a mapping with `models` and `pairs`")
    models: dict[str, ModelSpec] = {}
    for name, raw in (data.get("models") or {}).items():
        if not isinstance(raw, dict) or not raw.get("sources"):
            raise SpecvizError(f"model {name!r}: needs a non-empty `sources` list")
        srcs = tuple(_source(s, f"model {name!r}", base) for s in raw["sources"])
        models[str(name)] = ModelSpec(str(name), srcs, str(raw.get("description", "")))
    pairs: dict[str, PairSpec] = {}
    for name, raw in (data.get("pairs") or {}).items():
        where = f"pair {name!r}"
        if not isinstance(raw, dict):
            raise SpecvizError(f"{where}: must be a mapping")
        target = raw.get("target")
        if target not in models:
            raise SpecvizError(f"{where}: unknown target model {target!r}")
        if not isinstance(raw.get("drafter"), dict):
            raise SpecvizError(f"{where}: needs `drafter`, a mapping with a `kind`")
        drafter = _drafter(dict(raw["drafter"]), where, base)
        draft = PairSpec(str(name), target, drafter).draft_model
        if draft is not None and draft not in models:
            raise SpecvizError(f"{where}: unknown draft model {draft!r}")
        gamma = raw.get("gamma", 4)
        if not isinstance(gamma, int) or isinstance(gamma, bool) or not 1 <= gamma <= MAX_GAMMA:
            raise SpecvizError(f"{where}: gamma must be a whole number from 1 to {MAX_GAMMA}, got {gamma!r}")
        pairs[str(name)] = PairSpec(str(name), target, drafter, gamma, str(raw.get("description", "")))
    if not pairs:
        raise SpecvizError(f"{label} defines no pairs")
    default = data.get("default_pair")
    if default is not None and default not in pairs:
        raise SpecvizError(f"default_pair {default!r} is not a pair")
    return Registry(models, pairs, default)


def load_registry(path: str | os.PathLike | None = None) -> Registry:
    path = Path(path or os.environ.get("SPECVIZ_MODELS", DEFAULT_REGISTRY))
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8-sig"))
    except FileNotFoundError:
        raise SpecvizError(f"registry file not found: {path}") from None
    except IsADirectoryError:
        raise SpecvizError(f"{path} is a folder, not a registry file (.yaml)") from None
    except OSError as e:
        raise SpecvizError(f"cannot read the registry {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise SpecvizError(f"{path} is not UTF-8 text (byte {e.start}): a registry is a YAML file") from None
    except yaml.YAMLError as e:
        raise SpecvizError(f"{path} is not valid YAML: {e}".splitlines()[0]) from None
    label = "models.yaml" if path.resolve() == DEFAULT_REGISTRY.resolve() else str(path)
    try:
        return parse(data, path.parent, label)
    except SpecvizError as e:
        if str(e).startswith(label):
            raise
        raise SpecvizError(f"{label}: {e}") from None


DEFAULT_GAMMA = 4  # a named drafter's γ where models.yaml has no pair for its target


def recommended_pair(registry: Registry, target: str) -> PairSpec | None:
    """The pair models.yaml recommends for ``target``: the default pair if it verifies with it, else
    the first pair (those that work offline first) that does."""
    for pair, _ in registry.ordered_pairs():
        if pair.target == target:
            return pair
    return None


def default_gamma(registry: "Registry", target: str, drafter: dict) -> int:
    """γ for a drafter named without one, the same for the CLI, the API and the Lab: that of models.yaml's
    pair for ``target`` with this drafter (``drafters_pair``), else the recommended pair's, else 4."""
    own = drafters_pair(registry, target, drafter) or recommended_pair(registry, target)
    return own.gamma if own is not None else DEFAULT_GAMMA


def drafters_pair(registry: Registry, target: str, drafter: dict) -> PairSpec | None:
    """The pair whose γ a named drafter runs at by default: models.yaml's pair for ``target`` with
    that drafter (every key the name sets matches), else one with the same kind of drafter. A self-draft
    tuned for γ 3 ran at the head pair's 10 when a request named it without a γ."""
    pairs = [pair for pair, _ in registry.ordered_pairs() if pair.target == target]
    for pair in pairs:
        if all(pair.drafter.get(k) == v for k, v in drafter.items()):
            return pair
    return next((pair for pair in pairs if pair.drafter.get("kind") == drafter.get("kind")), None)
