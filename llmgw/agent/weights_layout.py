"""Giving an engine a model of several weights files under the names it expects.

Weights are cached by content (`<weights_dir>/sha256/<digest>`, `llmgw.agent.weights`), which loses their names. A
model of several files (sharded safetensors with `model.safetensors.index.json`, `config.json` and tokenizer files;
GGUF splits `name-00001-of-00003.gguf`) is laid out as a directory `<weights_dir>/models/<key>/` of hard links to
the cached files under their paths in the repository (`repository_path`), `key` a digest of the (path, sha256)
pairs, so two models sharing files share the cache and a changed file makes a new directory. The engine is given:

- vLLM and SGLang: the directory (they read `config.json` and the index there);
- llama.cpp: the first GGUF split (`-00001-of-`), which finds the other splits beside it by name, or the one GGUF.

A single file for llama.cpp is given as its cached path, as before. LoRA adapters (`lay_out_adapters`) go the same
way: llama.cpp gets an adapter's one GGUF, vLLM the directory holding its `adapter_config.json`. Before anything is laid out the set is checked
(`check_complete`): every shard an index names, and every split of a split GGUF, must be listed in the catalog.
Formats: Hugging Face's sharded checkpoints (`*.safetensors.index.json`, `weight_map`: tensor -> file name);
llama.cpp's `gguf-split` naming (`%s-%05d-of-%05d.gguf`, `llama_split_path` in llama.cpp).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import unquote, urlparse

from llmgw.engines import LoraAdapter
from llmgw.errors import WeightsError

_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")
_INDEX_SUFFIX = ".safetensors.index.json"
MARKER = ".complete"
PYTHON_ENGINES = ("vllm", "sglang")


def repository_path(source: str) -> str:
    """The file's path inside its repository: after `org/repo[@revision]/` for hf://, the last path component for
    https:// and file://. Raises WeightsError for a path that is empty or leaves its directory ("..")."""
    if source.startswith("hf://"):
        parts = source[len("hf://"):].split("/", 2)
        path = parts[2] if len(parts) == 3 else ""
    else:
        path = unquote(urlparse(source).path).rstrip("/").rsplit("/", 1)[-1]
    pure = PurePosixPath(path)
    if not path or pure.is_absolute() or ".." in pure.parts:
        raise WeightsError(f"{source}: cannot tell the file's name inside the model; name a file, not a directory")
    return str(pure)


def check_complete(names: Sequence[str], read: Callable[[str], bytes]) -> None:
    """Refuse a set of files (`names`, repository paths) that an engine could not load whole: an index
    `*.safetensors.index.json` naming a shard that is not listed, a GGUF split whose siblings are not all listed,
    or one name given twice. `read(name)` returns a listed file's bytes (only indexes are read).

    Raises: WeightsError naming the missing files and saying to add them to the catalog's `weights:`."""
    seen = set()
    for name in names:
        if name in seen:
            raise WeightsError(f"the weights list {name} twice; each file of a model is listed once")
        seen.add(name)
    missing: list[str] = []
    for name in names:
        folder = str(PurePosixPath(name).parent)
        if name.endswith(_INDEX_SUFFIX):
            try:
                weight_map = json.loads(read(name))["weight_map"]
                shards = {str(PurePosixPath(folder) / f) if folder != "." else f for f in weight_map.values()}
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise WeightsError(f"{name} is not a safetensors index (JSON with a weight_map): {exc}") from exc
            missing += sorted(shards - seen)
        split = _SPLIT.match(PurePosixPath(name).name)
        if split:
            count = int(split["count"])
            siblings = {str(PurePosixPath(folder) / f"{split['stem']}-{i:05d}-of-{count:05d}.gguf")
                        if folder != "." else f"{split['stem']}-{i:05d}-of-{count:05d}.gguf"
                        for i in range(1, count + 1)}
            missing += sorted(siblings - seen)
    if missing:
        unique = list(dict.fromkeys(missing))
        raise WeightsError(f"the model's weights are incomplete: {', '.join(unique)} "
                           f"{'is' if len(unique) == 1 else 'are'} named by its other files but not listed; add "
                           "each to the catalog's weights: with its sha256")


def layout_key(names: Sequence[str], digests: Sequence[str]) -> str:
    """16 hex digits naming the directory of this set of (path, sha256) pairs (order does not matter)."""
    text = "".join(f"{n}\0{d}\n" for n, d in sorted(zip(names, digests)))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def lay_out(weights_dir: Path, names: Sequence[str], paths: Sequence[Path]) -> Path:
    """The directory `<weights_dir>/models/<key>/` holding each of `paths` (cached files) as its name in `names`
    (hard links; a symbolic link where the file system refuses one). Built under a staging name and renamed into
    place, marked complete last: reused as it is when it exists. Blocking (file system).

    Raises: WeightsError from `check_complete`, or when the directory cannot be written (naming it)."""
    check_complete(names, lambda name: Path(paths[list(names).index(name)]).read_bytes())
    digests = [Path(p).name for p in paths]
    root = Path(weights_dir) / "models"
    final = root / layout_key(names, digests)
    if (final / MARKER).is_file():
        return final
    staging = root / f".staging-{final.name}-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        for name, path in zip(names, paths):
            target = staging / name
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, target)
            except OSError:
                target.symlink_to(Path(path).resolve())
        (staging / MARKER).write_text("\n".join(f"{n} {d}" for n, d in zip(names, digests)) + "\n")
        if final.exists():  # an earlier attempt that did not finish, or another shard's at the same time
            shutil.rmtree(final, ignore_errors=True)
        os.replace(staging, final)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if (final / MARKER).is_file():
            return final
        raise WeightsError(f"cannot lay out the model's weights in {final}: {exc}; check the weights "
                           "directory's space and permissions") from exc
    return final


def engine_model_path(engine: str, sources: Sequence[str], paths: Sequence[Path], weights_dir: Path,
                      names: Sequence[str | None] = ()) -> Path:
    """What to give `engine` as its model: see the module. `sources` and `paths` (their cached files) in the
    catalog's order; `names`, when given, the path of each file in the model's directory (None: `repository_path`
    of its source; a directory source's files are named relative to the directory it names). Blocking (lays out the
    directory). Raises WeightsError (see `lay_out`)."""
    if engine not in PYTHON_ENGINES and len(paths) == 1:
        return Path(paths[0])
    given = list(names) or [None] * len(sources)
    names = [name or repository_path(s) for s, name in zip(sources, given)]
    directory = lay_out(weights_dir, names, paths)
    if engine in PYTHON_ENGINES:
        return directory
    ggufs = [n for n in names if n.endswith(".gguf")]
    first = [n for n in ggufs if (m := _SPLIT.match(PurePosixPath(n).name)) and int(m["index"]) == 1]
    if len(first) + len([n for n in ggufs if not _SPLIT.match(PurePosixPath(n).name)]) != 1:
        raise WeightsError(f"llama.cpp loads one GGUF (or the first of its splits); the weights list "
                           f"{', '.join(ggufs) or 'none'}: list one model's GGUF files")
    return directory / (first[0] if first else next(n for n in ggufs if not _SPLIT.match(PurePosixPath(n).name)))


PEFT_CONFIG = "adapter_config.json"


def peft_rank(config_text: str, what: str) -> int:
    """The largest LoRA rank of a PEFT `adapter_config.json` (`r`, and the values of `rank_pattern`); 0 when it names
    none. Format: peft's `LoraConfig`. Raises WeightsError naming `what` when the text is not a JSON object."""
    try:
        config = json.loads(config_text)
        if not isinstance(config, dict):
            raise TypeError("not an object")
        ranks = [config.get("r") or 0, *(config.get("rank_pattern") or {}).values()]
        return max(int(r) for r in ranks)
    except (ValueError, TypeError, AttributeError) as exc:
        raise WeightsError(f"{what}: {PEFT_CONFIG} is not a PEFT LoRA config ({exc}); check the adapter's "
                           "files") from exc


def lay_out_adapters(engine: str, adapters: Sequence[Any], paths: Sequence[Path],
                     weights_dir: Path) -> tuple[LoraAdapter, ...]:
    """The adapters to give `engine`: `adapters` (each with `.name` and `.weights`, the wire's LoraAdapter) and
    `paths`, the cached files of all their weights one after the other in that order. llama.cpp gets each adapter's
    GGUF file; vLLM (and SGLang) the directory holding its `adapter_config.json` (laid out as `engine_model_path`
    does), with its rank (`peft_rank`). Blocking (file system). Raises WeightsError (`lay_out`, `peft_rank`, or an
    adapter of a Python engine without `adapter_config.json`)."""
    result = []
    rest = list(paths)
    for adapter in adapters:
        sources = [f.source for f in adapter.weights]
        mine, rest = rest[:len(sources)], rest[len(sources):]
        if engine not in PYTHON_ENGINES:
            result.append(LoraAdapter(adapter.name, engine_model_path(engine, sources, mine, weights_dir)))
            continue
        names = [repository_path(s) for s in sources]
        configs = [n for n in names if PurePosixPath(n).name == PEFT_CONFIG]
        if len(configs) != 1:
            raise WeightsError(f"adapter {adapter.name}: {engine} loads a PEFT adapter's directory, which holds one "
                               f"{PEFT_CONFIG}; its files are {', '.join(names)}")
        directory = engine_model_path(engine, sources, mine, weights_dir) / PurePosixPath(configs[0]).parent
        rank = peft_rank((directory / PEFT_CONFIG).read_text(), f"adapter {adapter.name}")
        result.append(LoraAdapter(adapter.name, directory, rank))
    return tuple(result)
