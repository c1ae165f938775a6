"""Nothing escapes the model root: multi-model loads while links are swapped under them,
hard links from outside, and archives that expand past their bounds (decompression bombs)."""

from __future__ import annotations

import gzip
import io
import itertools
import os
import random
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import orjson
import pytest
from conftest import SMC

from tfservo.core.archive_limits import ArchiveLimits
from tfservo.core.errors import BundleError, ModelLoadError, NotFound, PermissionDenied
from tfservo.core.settings import Settings
from tfservo.models.bundle import open_bundle
from tfservo.service.factory import ModelService
from tfservo.service.multi_model import MultiModelEndpoint

MME = SMC / "resources" / "mme"
VERSION = "00000123"


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    """root/inside (half_plus_two) and outside/evil (half_plus_three plus a secret), and four
    links inside the root that a swapper flips between the two: the model dir, a version dir,
    saved_model.pb, and variables/."""
    base = tmp_path_factory.mktemp("escape")
    root, outside = base / "root", base / "outside"
    inside = root / "inside" / VERSION
    evil = outside / "evil" / VERSION
    shutil.copytree(MME / "half_plus_two" / VERSION, inside)
    shutil.copytree(MME / "half_plus_three" / VERSION, evil)
    (evil / "secret.txt").write_text("read from outside the model root")
    (root / "vswap").mkdir()
    shutil.copytree(inside, root / "fswap" / VERSION)
    (root / "fswap" / VERSION / "saved_model.pb").unlink()
    shutil.copytree(inside, root / "dswap" / VERSION, ignore=shutil.ignore_patterns("variables"))
    links = {
        root / "swap": (root / "inside", outside / "evil"),
        root / "vswap" / VERSION: (inside, evil),
        root / "fswap" / VERSION / "saved_model.pb": (inside / "saved_model.pb", evil / "saved_model.pb"),
        root / "dswap" / VERSION / "variables": (inside / "variables", evil / "variables"),
    }
    for link, (good, _) in links.items():
        link.symlink_to(good)
    return root, inside, links


def flip(link: Path, target: Path) -> None:
    """Point `link` at `target` atomically (the link is never missing)."""
    tmp = link.with_name(link.name + ".tmp")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    os.replace(tmp, link)


def escaped(copy: str, inside: Path) -> list[str]:
    """Files of a loaded snapshot whose bytes are not the inside model's."""
    found = []
    for path in Path(copy).rglob("*"):
        if path.is_file():
            # flip()'s temporary link (name.tmp, a file or the variables/ dir) may be caught in the
            # copy: it stands for name
            original = inside.joinpath(*(part.removesuffix(".tmp") for part in path.relative_to(copy).parts))
            if not original.is_file() or original.read_bytes() != path.read_bytes():
                found.append(str(path.relative_to(copy)))
    return found


def test_200_loads_with_links_swapped_under_them_never_escape(layout):
    root, inside, links = layout
    service = ModelService(Settings(multi_model=True))
    endpoint = MultiModelEndpoint(service, str(root), memory_factor=0)
    stop = threading.Event()

    def swapper() -> None:
        rng = random.Random(7)
        while not stop.is_set():
            for link, targets in links.items():
                flip(link, targets[rng.random() < 0.5])
            time.sleep(rng.random() / 1000)

    outcomes: dict[str, int] = {}
    escapes: list[str] = []
    thread = threading.Thread(target=swapper, daemon=True)
    thread.start()
    try:
        urls = itertools.cycle(["swap", "vswap", "fswap", "dswap"])
        for attempt, url in zip(range(200), urls):
            name = f"m{attempt}"
            try:
                endpoint.load(name, url)
            except (PermissionDenied, NotFound, ModelLoadError) as exc:
                outcomes[type(exc).__name__] = outcomes.get(type(exc).__name__, 0) + 1
                continue
            outcomes["loaded"] = outcomes.get("loaded", 0) + 1
            copy = service.manager.model(name).versions[int(VERSION)].path
            escapes += [f"{url}: {f}" for f in escaped(copy, inside)]
            answer = orjson.loads(service.api.rest("predict", name, None, None, b'{"instances": [1.0]}'))
            if answer != {"predictions": [2.5]}:  # half_plus_three's 3.5: its graph or variables
                escapes.append(f"{url}: answered {answer}")
            endpoint.unload(name)
    finally:
        stop.set()
        thread.join()
        service.close()
    assert escapes == [], (escapes, outcomes)
    # The test means something only if some loads went through and some swaps were caught.
    assert outcomes.get("loaded", 0) >= 20 and outcomes.get("PermissionDenied", 0) >= 20, outcomes


def test_a_file_hard_linked_from_outside_is_refused(layout, tmp_path):
    root = layout[0]
    secret = tmp_path / "secret.pb"
    shutil.copy(MME / "half_plus_three" / VERSION / "saved_model.pb", secret)
    model = root / "hard" / VERSION
    shutil.copytree(MME / "half_plus_two" / VERSION, model)
    (model / "saved_model.pb").unlink()
    os.link(secret, model / "saved_model.pb")
    # Hard links within the model are fine: both names are in the tree.
    twin = root / "twin" / VERSION
    shutil.copytree(MME / "half_plus_two" / VERSION, twin)
    os.link(twin / "saved_model.pb", twin / "copy_of_saved_model.pb")

    service = ModelService(Settings(multi_model=True))
    endpoint = MultiModelEndpoint(service, str(root), memory_factor=0)
    try:
        with pytest.raises(PermissionDenied, match="saved_model.pb, a file with 2 hard links, 1 of them outside"):
            endpoint.load("hard", "hard")
        assert not endpoint.is_loaded("hard") and service.manager.model_names() == []
        endpoint.load("twin", "twin")
        assert endpoint.is_loaded("twin")
    finally:
        service.close()


# -- archives ----------------------------------------------------------------------------------


def tar_gz(path: Path, members: dict[str, bytes | int]) -> Path:
    """A .tar.gz of `members`: name → bytes, or a size of zeros streamed without holding them."""
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1) as gz:
        with tarfile.open(fileobj=gz, mode="w") as tar:
            for name, content in members.items():
                info = tarfile.TarInfo(name)
                if isinstance(content, int):
                    info.size = content
                    tar.addfile(info, _Zeros(content))
                else:
                    info.size = len(content)
                    tar.addfile(info, io.BytesIO(content))
    return path


class _Zeros(io.RawIOBase):
    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self.left)
        buffer[:n] = bytes(n)
        self.left -= n
        return n


# Extract in a child whose files may not grow past `limit` bytes (RLIMIT_FSIZE): a refusal that
# came after writing more would show up as "File too large" instead of the bounds' message.
_EXTRACT_UNDER_LIMIT = """
import resource, sys
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), int(sys.argv[2])))
from tfservo.models.bundle import open_bundle
from tfservo.core.errors import BundleError
try:
    open_bundle(sys.argv[1], cache_dir=sys.argv[3])
except BundleError as exc:
    print(exc.message)
"""


def test_a_gzip_bomb_is_refused_before_10x_its_size_is_written(tmp_path):
    bomb = tar_gz(tmp_path / "model.tar.gz", {f"model/{VERSION}/variables/variables.data-00000-of-00001": 1 << 30})
    compressed = bomb.stat().st_size
    assert compressed < 8 << 20  # 1 GiB of zeros in a few MB
    cache = tmp_path / "cache"
    done = subprocess.run(
        [sys.executable, "-c", _EXTRACT_UNDER_LIMIT, str(bomb), str(10 * compressed), str(cache)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "a decompression bomb?" in done.stdout and "TFSERVO_ARCHIVE_MAX_RATIO" in done.stdout, done.stdout
    written = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file())
    assert written == 0


def test_many_small_members_are_held_to_the_same_bounds(tmp_path):
    flood = tar_gz(tmp_path / "flood.tar.gz", {f"model/{VERSION}/f{i}": 1 << 20 for i in range(100)})
    with pytest.raises(BundleError, match=r"over 100x \(a decompression bomb\?\)"):
        open_bundle(str(flood), cache_dir=str(tmp_path / "c1"))
    with pytest.raises(BundleError, match="more than 10 members; if that is right, raise TFSERVO_ARCHIVE_MAX_FILES"):
        open_bundle(str(flood), cache_dir=str(tmp_path / "c2"), limits=ArchiveLimits(max_files=10))
    with pytest.raises(BundleError, match="over the bound of 1 MiB; free space or raise TFSERVO_ARCHIVE_MAX_GB"):
        open_bundle(str(flood), cache_dir=str(tmp_path / "c3"), limits=ArchiveLimits(max_bytes=1 << 20))
    for cache in ("c1", "c2", "c3"):
        assert not [f for f in (tmp_path / cache).rglob("*") if f.is_file()]
    # Within the bounds, the same archive extracts.
    opened = open_bundle(str(flood), cache_dir=str(tmp_path / "c4"), limits=ArchiveLimits(max_ratio=10_000))
    [f99] = Path(opened.root).rglob("f99")
    assert f99.stat().st_size == 1 << 20
