"""The job file loader: YAML, the presets it ``extends``, ``--set`` overrides, validated by the schema.

``load_job(path, overrides)`` reads YAML with :class:`JobLoader` (``yaml.SafeLoader`` that refuses
duplicate keys), merges the presets named in
``extends`` (a ``configs/`` folder beside the job file, then the built-in ``rapids_attn/presets``),
applies ``--set a.b=value`` overrides, and validates against the schema (:class:`rapids_attn.job.JobConfig`). Every
error becomes one :class:`JobConfigError` line that names the field and says how to fix it
(:func:`rapids_attn.job.one_line`); an unknown key suggests the closest valid name. What a job file may cost is
bounded before it is spent: its size (:data:`MAX_JOB_BYTES`), its nesting (:data:`MAX_DEPTH`) and the values its
YAML aliases expand to (:data:`MAX_NODES`); a path no file system can hold is refused naming its field
(:data:`NAME_MAX`, :data:`PATH_MAX`).
"""

from __future__ import annotations

import copy
import difflib
import os
import stat
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import BaseModel, ValidationError

from rapids_attn.errors import JobConfigError
from rapids_attn.job import MAX_QUOTED, JobCore, clip, one_line, show
from rapids_attn.registry import job_model

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

#: The folder a job may keep its own presets in, beside the job file or in one of its parents.
LOCAL_PRESETS = "configs"

#: the largest job file (or preset) read, in bytes: a job is a few KB; a bigger file is not read at all.
MAX_JOB_BYTES = 1_000_000
#: the deepest a job file (or a --set value) may nest, aliases expanded: a job is four or five levels deep
#: (section, subsection, a list); PyYAML composes recursively, so a deeper one would end in RecursionError.
MAX_DEPTH = 100
#: the most values (YAML nodes) a job file may hold once its aliases are expanded: a job holds about a
#: hundred; nested aliases ("billion laughs") would otherwise expand to billions in validation or an error.
MAX_NODES = 100_000


def builtin_presets() -> Traversable:
    """The presets shipped in the package (``rapids_attn/presets``), read through importlib.resources
    so that an installed wheel finds them exactly as the checkout does."""
    return resources.files("rapids_attn") / "presets"


def _deep_merge(base: dict, top: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in top.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping in the job (or a preset) gives one key twice; YAML itself would keep the last silently."""


class JobBoundError(yaml.composer.ComposerError):
    """A job file past a bound (:data:`MAX_DEPTH`, :data:`MAX_NODES`), an alias that contains itself, or a value
    Python cannot read (a 5,000-digit number, the 13th month): refused where it is, before it costs anything."""


def _children(node: yaml.Node) -> list:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return node.value
    return []


def check_expansion(root: yaml.Node) -> None:
    """Refuse a composed document whose aliases expand past :data:`MAX_NODES` values or :data:`MAX_DEPTH` levels,
    or into a loop (``&a [*a]``). An alias is a second reference to a node, so this walks each node once
    (memoized, without recursion), in time linear in the file, however far the aliases would expand."""
    done: dict[int, tuple[int, int]] = {}  # id(node) -> (values, depth) with aliases expanded
    open_: set[int] = set()  # the nodes on the path being walked
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, closing = stack.pop()
        key = id(node)
        if closing:
            open_.discard(key)
            kids = [done[id(k)] for k in _children(node)]
            size = 1 + sum(k[0] for k in kids)
            depth = 1 + max((k[1] for k in kids), default=0)
            if size > MAX_NODES:
                raise JobBoundError(
                    None,
                    None,
                    f"YAML aliases expand this value to {size:,} values, more than a job may hold "
                    f"({MAX_NODES:,}); write the values out, or use fewer aliases",
                    node.start_mark,
                )
            if depth > MAX_DEPTH:
                raise JobBoundError(
                    None,
                    None,
                    f"YAML aliases nest this value {depth:,} levels deep, deeper than a job may "
                    f"({MAX_DEPTH}); use fewer nested aliases",
                    node.start_mark,
                )
            done[key] = (size, depth)
            continue
        if key in done:
            continue
        open_.add(key)
        stack.append((node, True))
        for kid in _children(node):
            if id(kid) in open_:
                raise JobBoundError(
                    None,
                    None,
                    "a YAML alias refers to a value that contains it (a loop); remove the alias",
                    kid.start_mark,
                )
            if id(kid) not in done:
                stack.append((kid, False))


class JobLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping (naming it and both lines), nesting
    deeper than :data:`MAX_DEPTH` (as it is read: PyYAML composes recursively), aliases that expand past
    :data:`MAX_NODES` values, and values Python cannot read (a ValueError of the constructor), each as a
    :class:`yaml.YAMLError` with the line."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0  # values composed so far (an alias counts once here, in full in check_expansion)

    def _too_deep(self, mark) -> JobBoundError:
        return JobBoundError(
            None, None, f"nested deeper than a job may be ({MAX_DEPTH} levels; a job has four or five)", mark
        )

    def fetch_flow_collection_start(self, TokenClass):
        """``[`` or ``{``: refused past the bound as soon as it is scanned (the scanner looks ahead of the
        composer, so 100,000 brackets would otherwise all be scanned first)."""
        if self.flow_level >= MAX_DEPTH:
            raise self._too_deep(self.get_mark())
        super().fetch_flow_collection_start(TokenClass)

    def compose_node(self, parent, index):
        if self._depth >= MAX_DEPTH:
            raise self._too_deep(self.peek_event().start_mark)
        self._nodes += 1
        if self._nodes > MAX_NODES:  # stop reading a long list here: it is refused whole anyway
            raise JobBoundError(
                None,
                None,
                f"more than {MAX_NODES:,} values, more than a job may hold; keep long lists in a data file",
                self.peek_event().start_mark,
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self):
        node = super().compose_document()
        check_expansion(node)
        return node

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, OverflowError) as e:  # int("1" * 5000), date(2020, 13, 1): the constructor's own
            why = str(e).split(";")[0]  # not "use sys.set_int_max_str_digits()"
            value = node.value if isinstance(node.value, str) else ""
            raise JobBoundError(None, None, f"cannot read {show(value)} ({clip(why)})", node.start_mark) from None

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:  # the mapping's own keys: one a merge (<<) brings in may be overridden
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                try:
                    key = self.construct_object(key_node, deep=True)
                    hash(key)
                except (TypeError, yaml.constructor.ConstructorError):
                    continue  # the base class reports an unhashable key
                if key in seen:
                    raise DuplicateKeyError(
                        None,
                        None,
                        f"duplicate key {show(key)} (first on line {seen[key] + 1}); keep one of them",
                        key_node.start_mark,
                    )
                seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def yaml_load(text: str) -> Any:
    """Parse YAML as the job file is parsed: safe, refusing duplicate keys, and bounded (:class:`JobLoader`)."""
    return yaml.load(text, Loader=JobLoader)  # JobLoader is a SafeLoader


def _read_bounded(path: Path | Traversable, what: str) -> str:
    """The file's text, read only when it is at most :data:`MAX_JOB_BYTES` (at most that many bytes are read)."""
    with path.open("rb") as f:
        data = f.read(MAX_JOB_BYTES + 1)
        if len(data) > MAX_JOB_BYTES:
            try:
                st = os.fstat(f.fileno())
                size = f"{st.st_size / 1e6:,.1f} MB" if stat.S_ISREG(st.st_mode) else None
            except (AttributeError, OSError, ValueError):  # a resource that is no file on disk
                size = None
            size = size or f"over {MAX_JOB_BYTES / 1e6:g} MB"
            raise JobConfigError(
                f"{what}: {path} is {size}; a job file may be at most {MAX_JOB_BYTES / 1e6:g} MB (a job is a few "
                "KB): give the job's YAML file, and keep long lists in a data file"
            )
    return data.decode("utf-8")


def _read_yaml(path: Path | Traversable, what: str) -> dict:
    try:
        text = _read_bounded(path, what)
    except FileNotFoundError:
        raise JobConfigError(f"{what}: no such file: {path}") from None
    except IsADirectoryError:
        raise JobConfigError(
            f"{what}: {path} is a directory; give the job's YAML file (e.g. jobs/quickstart.yaml)"
        ) from None
    except UnicodeDecodeError as e:
        raise JobConfigError(
            f"{what}: {path} is not a UTF-8 text file (byte {e.start} is 0x{e.object[e.start]:02x}); "
            "give a YAML job file, saved as UTF-8"
        ) from None
    except OSError as e:
        raise JobConfigError(f"{what}: cannot read {path} ({e.strerror or type(e).__name__}); check the path") from None
    try:
        raw = yaml_load(text)
    except RecursionError:  # not expected past JobLoader's bounds: still one line
        raise JobConfigError(f"{path}: nested too deep to read; a job is four or five levels deep") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        if isinstance(e, (DuplicateKeyError, JobBoundError)):
            raise JobConfigError(f"{path}{where}: {e.problem}") from None
        if isinstance(e, yaml.reader.ReaderError):  # a character YAML refuses (NUL, a control code)
            ch = e.character if isinstance(e.character, int) else ord(e.character)
            raise JobConfigError(
                f"{path}: not a YAML text file (character #x{ch:04x} at position {e.position}); give a YAML job file"
            ) from None
        problem = clip(" ".join(str(getattr(e, "problem", None) or e).split()), 2 * MAX_QUOTED)
        raise JobConfigError(f"{path}{where}: not valid YAML ({problem})") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise JobConfigError(f"{path}: the job must be a YAML mapping of sections, got {type(raw).__name__}")
    return raw


def preset_dirs(job_path: Path | None) -> list[Traversable]:
    """Where ``extends`` names are looked up, in order: the nearest ``configs/`` folder beside the job
    file or in one of its parents (a project's own presets, which win), then the built-in presets."""
    dirs: list[Traversable] = []
    if job_path is not None:
        for parent in [job_path.resolve().parent, *job_path.resolve().parents]:
            if (parent / LOCAL_PRESETS).is_dir():
                dirs.append(parent / LOCAL_PRESETS)
                break
    dirs.append(builtin_presets())
    return dirs


def _preset_file(root: Traversable, name: str) -> Traversable:
    """``models/minilm-l6`` -> ``root/models/minilm-l6.yaml``, one part at a time (a Traversable
    joins one name per step)."""
    node = root
    *folders, last = name.split("/")
    for part in folders:
        node = node / part
    return node / f"{last}.yaml"


def _preset_names(root: Traversable, prefix: str = "") -> list[str]:
    """Every preset name under ``root`` (``folder/name`` without ``.yaml``), for the "did you mean"."""
    names = []
    for child in root.iterdir():
        if child.is_dir():
            names += _preset_names(child, f"{prefix}{child.name}/")
        elif child.name.endswith(".yaml"):
            names.append(prefix + child.name[: -len(".yaml")])
    return names


def _resolve_preset(name: str, dirs: list[Traversable]) -> Traversable:
    if not isinstance(name, str) or not name or any(p in ("", ".", "..") for p in name.split("/")):
        raise JobConfigError(f"extends: {show(name)} is not a preset name; use folder/name, e.g. models/minilm-l6")
    for d in dirs:
        p = _preset_file(d, name)
        try:
            if p.is_file():
                return p
        except OSError:  # a name too long for the filesystem: no such preset
            continue
    known = sorted({n for d in dirs if d.is_dir() for n in _preset_names(d)})
    near = difflib.get_close_matches(name, known, n=1) if len(name) <= MAX_QUOTED else []
    hint = f"did you mean '{near[0]}'?" if near else f"known presets: {', '.join(known) or 'none'}"
    raise JobConfigError(f"extends: no preset '{clip(name)}' under {', '.join(map(str, dirs))}; {hint}")


def _anchor_data_path(preset: dict, path: Traversable, name: str) -> None:
    """Make a preset's relative ``data.path`` absolute against the preset's own folder.

    A preset that names data ships with it (``data/quickstart`` points into the package), so its
    path must not depend on where the job that extends it lives or where it is run from. A job's own
    relative ``data.path`` is still resolved against the job file, in :func:`load_job`. A hub dataset id
    (``owner/name``) with nothing of its name beside the preset stays an id."""
    from rapids_attn.data.hub import hub_id

    data = preset.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("path"), str):
        return
    p = Path(data["path"]).expanduser()
    if p.is_absolute():
        return
    if hub_id(p) is not None and not (isinstance(path, Path) and (path.parent / p).exists()):
        return
    if not isinstance(path, Path):  # e.g. a package imported from a zip file: no folder on disk
        raise JobConfigError(
            f"extends: preset '{name}': data.path {clip(data['path'])} is relative to the preset, "
            f"but the preset is not a file on disk ({path}); give an absolute data.path"
        )
    data["path"] = str((path.parent / p).resolve())


def _expand_extends(raw: dict, dirs: list[Traversable], seen: tuple[str, ...] = ()) -> dict:
    extends = raw.get("extends", []) or []
    if isinstance(extends, str):
        extends = [extends]
    if not isinstance(extends, list):
        raise JobConfigError("extends: must be a list of preset names, e.g. [models/minilm-l6]")
    merged: dict = {}
    for name in extends:
        if name in seen:
            raise JobConfigError(f"extends: preset '{clip(name)}' extends itself through {' -> '.join(seen)}")
        path = _resolve_preset(name, dirs)
        preset = _read_yaml(path, f"extends: preset '{name}'")
        _anchor_data_path(preset, path, name)
        merged = _deep_merge(merged, _expand_extends(preset, dirs, (*seen, name)))
    body = {k: v for k, v in raw.items() if k != "extends"}
    out = _deep_merge(merged, body)
    out["extends"] = list(extends) + [e for e in merged.get("extends", []) if e not in extends]
    return out


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b=value`` -> (["a", "b"], value); the value is parsed as YAML (so 3, true, [0, 1] work)."""
    if "=" not in text:
        raise JobConfigError(f"--set {clip(text)}: expected KEY=VALUE, e.g. --set data.limit=100")
    key, _, value = text.partition("=")
    parts = [p for p in key.strip().split(".")]
    if not all(parts):
        raise JobConfigError(f"--set {clip(text)}: the key '{clip(key)}' has an empty part")
    if len(text) > MAX_JOB_BYTES:
        raise JobConfigError(
            f"--set {clip(text)}: a value of {len(value):,} characters; a job's values are short, at most "
            f"{MAX_JOB_BYTES / 1e6:g} MB (keep long lists in a data file)"
        )
    try:
        parsed = yaml_load(value) if value.strip() else None
    except (DuplicateKeyError, JobBoundError) as e:
        raise JobConfigError(f"--set {clip(text)}: {e.problem}") from None
    except RecursionError:  # not expected past JobLoader's bounds: still one line
        raise JobConfigError(f"--set {clip(text)}: nested too deep to read") from None
    except yaml.YAMLError:
        parsed = value
    return parts, parsed


def _apply_override(raw: dict, parts: list[str], value: Any, text: str) -> None:
    node = raw
    for p in parts[:-1]:
        nxt = node.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise JobConfigError(f"--set {clip(text)}: '{clip(p)}' is a value, not a section")
        node = nxt
    node[parts[-1]] = value


def _fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """The valid field names of the section that ``loc`` (a pydantic error location) points into."""
    cur: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = getattr(cur, "model_fields", {}).get(part)
        if field is None:
            return []
        ann = field.annotation
        cur = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
        if cur is None:
            return []
    return list(getattr(cur, "model_fields", {}))


def format_validation_error(err: ValidationError, source: str) -> str:
    """The first error of a pydantic ValidationError as one actionable line. Every part the user wrote is cut
    to :data:`MAX_QUOTED` characters (:func:`clip`, :func:`show`): a key, the value ("got ..."), and a
    validator's message that quotes the value."""
    errors = err.errors()
    e = errors[0]
    loc = tuple(e["loc"])
    field = ".".join(clip(p) for p in map(str, loc)) or "(top level)"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    if e["type"] == "extra_forbidden":
        valid = _fields_at(job_model(), loc)
        last = str(loc[-1])
        near = difflib.get_close_matches(last, valid, n=1, cutoff=0.5) if len(last) <= MAX_QUOTED else []
        hint = f"did you mean '{near[0]}'?" if near else f"valid keys here: {', '.join(valid)}"
        return f"{source}: {field}: unknown key; {hint}{more}"
    if e["type"] == "missing":
        return f"{source}: {field}: required but missing; add it to the job or pass --set {field}=...{more}"
    msg = clip(e["msg"].removeprefix("Value error, "), 4 * MAX_QUOTED)
    if msg.startswith(f"{field}["):  # a validator that names the entry at fault (compare.models[1]: ...)
        return f"{source}: {msg}{more}"
    given = e.get("input")
    shown = f" (got {show(given)})" if given is not None and not isinstance(given, dict) else ""
    return f"{source}: {field}: {msg}{shown}{more}"


def load_job(path: str | Path | None, overrides: list[str] | tuple[str, ...] = (), raw: dict | None = None) -> JobCore:
    """Read, merge presets, apply overrides, validate. Raises JobConfigError with one line (:func:`one_line`:
    at most :data:`MAX_LINE` characters, whatever the job holds)."""
    try:
        return _load_job(path, overrides, raw)
    except JobConfigError as e:
        line = one_line(str(e))
        if line == str(e):
            raise
        raise JobConfigError(line) from None


def _load_job(path: str | Path | None, overrides: list[str] | tuple[str, ...], raw: dict | None) -> JobCore:
    job_path = Path(path) if path is not None else None
    if raw is None:
        if job_path is None:
            raise JobConfigError("no job file given")
        raw = _read_yaml(job_path, "job")
    source = str(job_path) if job_path is not None else "job"
    raw = _expand_extends(raw, preset_dirs(job_path))
    for text in overrides:
        parts, value = parse_override(text)
        if parts[0] == "extends":  # the presets are merged beneath the job before any --set: one set here is never read
            raise JobConfigError(
                "--set extends: extends is read from the job file only (its presets are merged before --set "
                "applies); write extends: [preset, ...] in the job file, or --set the presets' fields themselves"
            )
        _apply_override(raw, parts, value, text)
    # a relative data path the job gives (a preset's was anchored to the preset in _expand_extends) is
    # relative to the job file, so jobs can be run from anywhere
    data = raw.get("data")
    if job_path is not None and isinstance(data, dict) and isinstance(data.get("path"), str):
        p = Path(data["path"]).expanduser()
        try:
            if not p.is_absolute() and not p.exists() and (job_path.resolve().parent / p).exists():
                data["path"] = str((job_path.resolve().parent / p).resolve())
        except OSError:  # a name too long for the filesystem, say: preflight names it, as any missing path
            pass
    try:
        cfg = job_model().model_validate(raw)  # the core sections and the registered stages' (rapids_attn.registry)
    except ValidationError as err:
        raise JobConfigError(format_validation_error(err, source)) from None
    _check_path_lengths(cfg)
    return cfg


#: the longest file name (one path component) and path, in bytes, that Linux and macOS file systems take
NAME_MAX, PATH_MAX = 255, 4096


def _check_path_lengths(cfg: JobCore) -> None:
    """A path no file system can hold is refused here, naming its field: it would otherwise surface as an
    ``OSError`` (``File name too long``) from whichever library touched it first."""
    fields = {
        "data.path": cfg.data.path,
        "model.name": cfg.model.name,
        "output.dir": cfg.run_dir,
        "runtime.scheduler_file": cfg.runtime.scheduler_file,
    }
    for field, value in fields.items():
        if value is None:
            continue
        raw = os.fsencode(str(value))
        longest = max((len(part) for part in raw.split(b"/")), default=0)
        if longest > NAME_MAX or len(raw) > PATH_MAX:
            what = f"a name of {longest:,} bytes" if longest > NAME_MAX else f"{len(raw):,} bytes"
            raise JobConfigError(
                f"{field}: {clip(str(value))} is too long for a file system ({what}; at most {NAME_MAX} bytes a name "
                f"and {PATH_MAX} a path); shorten it"
            )
