"""Pack vLLM 0.21.0 and the wheels the GPU image lacks into parts of at most 50 MB.

For a GPU host without network that takes files in transfers of at most 64 MiB
(the checkout plus the parts sent with it): the bundle goes one part at a time
and is reassembled there by ``tests/gpu/remote.sh``. Everything is downloaded
here, with the ordinary PyPI client, for the GPU host's interpreter (cp312,
manylinux x86_64).

What is left out of the vLLM wheel and why:

* ``vllm_flash_attn/_vllm_fa2_C.abi3.so`` (190 MB): a Hopper card runs
  FLASH_ATTN through FA3 (``_vllm_fa3_C``), which stays;
* ``vllm_flash_attn/cute/``: FlashAttention 4 (CuTe DSL), which the proof
  must not have, since sm_12x cards lack it and its absence is what makes
  vLLM force TRITON_ATTN for Gemma 4;
* DeepGEMM's extensions for other Pythons than 3.12.

Output (under ``.stage/``, ignored by git): ``bundle.tar.xz.partNN`` and
``bundle.json`` (part names, sizes, sha256 of the parts and of the whole).
The tarball holds ``site/`` (the vLLM files, laid out as site-packages) and
``wheels/`` (installed with ``pip install --no-index --no-deps --target``).
Run: ``python tests/gpu/staging/stage.py`` (idempotent; downloads are cached).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
VLLM_VERSION = "0.21.0"
# One transfer holds 64 MiB (67.1 MB) with the tracked tree (about 28-30 MB, growing with the
# results' log archives and the benchmark files that keep their outputs): 32 MB parts leave the
# tree 35 MB less the 3 MiB a transfer keeps for raw records.
PART_BYTES = 32 * 1000 * 1000
REQUIREMENTS = Path(__file__).resolve().parents[1] / "bundle-requirements.txt"
PLATFORMS = [
    "manylinux_2_34_x86_64", "manylinux_2_31_x86_64", "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64", "manylinux_2_26_x86_64", "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_5_x86_64",
    "manylinux1_x86_64",
]


def wheel_member_dropped(name: str, keep_fa2: bool = False) -> bool:
    """True for wheel members the device bundle leaves out (see module docstring)."""
    if name.endswith("vllm_flash_attn/_vllm_fa2_C.abi3.so"):
        return not keep_fa2
    if name == "vllm/vllm-rs":  # 0.33.0's Rust front end, only for `vllm-rs serve`
        return True
    if "/vllm_flash_attn/cute/" in f"/{name}":
        return True
    if "third_party/deep_gemm/_C.cpython-" in name and "cpython-312-" not in name:
        return True
    return False


def vllm_wheel(version: str = VLLM_VERSION) -> Path:
    sys.path.insert(0, str(REPO))
    from launcher import pypi

    return pypi.fetch("vllm", version, "wheel")


def requirements_for(version: str) -> Path:
    """0.21.0's pins are ``bundle-requirements.txt``; another version's are
    ``bundle-requirements-<version>.txt`` (what the device image lacks for it)."""
    if version == VLLM_VERSION:
        return REQUIREMENTS
    path = REQUIREMENTS.with_name(f"bundle-requirements-{version}.txt")
    if not path.exists():
        raise SystemExit(f"no {path.name}: list the wheels vLLM {version} needs beyond the device image first")
    return path


def bundle_stem(version: str) -> str:
    """``bundle`` for 0.21.0 (the proof's own), ``bundle-<version>`` otherwise."""
    return "bundle" if version == VLLM_VERSION else f"bundle-{version}"


def _download_binaries(dest: Path, *what: str) -> None:
    """``pip download`` of wheels for the device's interpreter (cp312, manylinux x86_64)."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3",
           "--abi", "none", "-d", str(dest), *what]
    for plat in PLATFORMS:
        cmd += ["--platform", plat]
    subprocess.run(cmd, check=True)


def download_wheels(dest: Path, requirements: Path = REQUIREMENTS) -> list[Path]:
    _download_binaries(dest, "-r", str(requirements))
    # The cache may hold other versions from earlier pins: take exactly the pinned ones.
    wanted = {(_norm(name), version) for name, version in
              (line.split("==") for line in _requirements(requirements))}
    wheels = [w for w in sorted(dest.glob("*.whl"))
              if (_norm(w.name.split("-")[0]), w.name.split("-")[1]) in wanted]
    missing = {n for n, _ in wanted} - {_norm(w.name.split("-")[0]) for w in wheels}
    if missing:
        raise SystemExit(f"wheels missing after download: {sorted(missing)}")
    return wheels


QUANT_REQUIREMENTS = Path(__file__).resolve().parents[1] / "quantize-requirements.txt"
# Ray for the multi-node Ray plans' checks on the GPU host (remote.sh engine-check): vLLM installs no
# Ray, and without it create_engine_config refuses a Ray head ("Failed to import Ray"). The wheel
# alone: what it requires (click, filelock, jsonschema, msgpack, packaging, protobuf, pyyaml,
# requests) the device image and the vLLM bundles hold. Pinned: the release current when staged.
RAY_PIN = "ray==2.60.0"


def download_ray_wheel(dest: Path) -> Path:
    """The pinned Ray wheel for the device's interpreter, alone in ``dest``."""
    if dest.exists():
        shutil.rmtree(dest)
    _download_binaries(dest, RAY_PIN)
    return dest
SDIST_ONLY = {"antlr4-python3-runtime"}


def download_quant_wheels(dest: Path) -> Path:
    """The wheels (and one pure-Python sdist) that ``launcher quantize`` needs on the GPU host."""
    pins = _requirements(QUANT_REQUIREMENTS)
    binary = [p for p in pins if p.split("==")[0] not in SDIST_ONLY]
    source = [p for p in pins if p.split("==")[0] in SDIST_ONLY]
    _download_binaries(dest, *binary)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary=:all:",
                    "-d", str(dest), *source], check=True)
    return dest


def _requirements(path: Path = REQUIREMENTS) -> list[str]:
    return [
        line.strip() for line in path.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]


def _norm(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def build_tree(wheel: Path, wheels: list[Path], tree: Path, keep_fa2: bool = False) -> None:
    if tree.exists():
        shutil.rmtree(tree)
    site = tree / "site"
    site.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if info.is_dir() or wheel_member_dropped(info.filename, keep_fa2):
                continue
            zf.extract(info, site)
    (tree / "wheels").mkdir()
    for w in wheels:
        shutil.copy2(w, tree / "wheels" / w.name)


def pack(tree: Path, out: Path, stem: str = "bundle") -> Path:
    tarball = out / f"{stem}.tar.xz"
    raw = out / f"{stem}.tar"
    with tarfile.open(raw, "w") as tf:
        for top in ("site", "wheels"):
            tf.add(tree / top, arcname=top)
    subprocess.run(["xz", "-T0", "-6", "-f", str(raw)], check=True)
    return tarball


def split(tarball: Path, out: Path, stem: str = "bundle", version: str = VLLM_VERSION,
          part_bytes: int = PART_BYTES) -> dict:
    """Cut ``tarball`` into ``<stem>.<suffix>.partNN`` files plus ``<stem>.json`` (checksums)."""
    for old in out.glob(f"{tarball.name}.part*"):
        old.unlink()
    whole = hashlib.sha256()
    parts = []
    with tarball.open("rb") as fh:
        index = 0
        while chunk := fh.read(part_bytes):
            whole.update(chunk)
            name = f"{tarball.name}.part{index:02d}"
            (out / name).write_bytes(chunk)
            parts.append({"name": name, "bytes": len(chunk),
                          "sha256": hashlib.sha256(chunk).hexdigest()})
            index += 1
    manifest = {"vllm": version, "sha256": whole.hexdigest(),
                "bytes": tarball.stat().st_size, "parts": parts}
    (out / f"{stem}.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


CALL_BYTES = 64 * 1024 * 1024  # one transfer to the GPU host: the tracked tree and the parts sent with it


def tree_bytes(repo: Path = REPO) -> int:
    """The tree as a transfer copies it: tracked files and the untracked ones git does not
    ignore (new log archives not yet committed count too), as they are on disk."""
    names = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, check=True).stdout
    return sum((repo / n).stat().st_size for n in names.decode().split("\0") if n and (repo / n).is_file())


def resplit(out: Path, stem: str, part_bytes: int = PART_BYTES) -> dict:
    """A staged bundle cut again into parts of ``part_bytes`` (the whole file, and so the
    device's sha256 check, unchanged): the parts of an older, larger PART_BYTES no longer fit
    a transfer beside the tree."""
    manifest = json.loads((out / f"{stem}.json").read_text())
    names = [p["name"] for p in manifest["parts"]]
    tarball = out / names[0].rsplit(".part", 1)[0]
    whole = hashlib.sha256()
    with tarball.open("wb") as dst:
        for name in names:
            data = (out / name).read_bytes()
            whole.update(data)
            dst.write(data)
    if whole.hexdigest() != manifest["sha256"]:
        tarball.unlink()
        raise SystemExit(f"{stem}: the staged parts do not make the whole its manifest names")
    new = split(tarball, out, stem, manifest.get("vllm", VLLM_VERSION), part_bytes)
    tarball.unlink()
    # Only the cut changes: what else the manifest said (an extras bundle's target_sha256, its
    # lack of a vllm field) stays as it was.
    kept = {k: v for k, v in manifest.items() if k not in ("parts", "vllm")} | {"parts": new["parts"]}
    if "vllm" in manifest:
        kept["vllm"] = manifest["vllm"]
    (out / f"{stem}.json").write_text(json.dumps(kept, indent=2) + "\n")
    return kept


def pack_extras(wheel: Path | None, models: list[Path], out: Path, stem: str,
                wheels: Path | None = None) -> dict:
    """An extra bundle: FA2 (what FLASH_ATTN runs on sm_12x) and/or checkpoints made here.

    ``_vllm_fa2_C.abi3.so`` is xz-compressed on its own (190 MB -> ~54 MB); the
    checkpoints (NVFP4 from ``launcher quantize``, which the device cannot
    run: no modelopt there) go in as they are. ``remote.sh extras`` unpacks
    every ``extras*`` bundle staged: the library into the installed vLLM,
    the checkpoints into $MODELS_RS.
    """
    work = out / f"{stem}-tree"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    if wheel is not None:
        (work / "fa2").mkdir()
        member = "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, \
                (work / "fa2" / "_vllm_fa2_C.abi3.so").open("wb") as dst:
            shutil.copyfileobj(src, dst)
        subprocess.run(["xz", "-T0", "-6", "-f", str(work / "fa2" / "_vllm_fa2_C.abi3.so")], check=True)
    tarball = out / f"{stem}.tar"
    with tarfile.open(tarball, "w") as tf:
        if wheel is not None:
            tf.add(work / "fa2", arcname="fa2")
        for m in models:
            tf.add(m, arcname=f"models/{m.name}")
        if wheels is not None:
            tf.add(wheels, arcname="wheels")
    manifest = split(tarball, out, stem=stem)
    tarball.unlink()
    shutil.rmtree(work)
    return manifest


CORPUS_CACHE = Path.home() / ".cache" / "vllm-sm12x" / "corpus"


def stage_corpus(out: Path, cache: Path = CORPUS_CACHE) -> list[Path]:
    """corpus.json's wheels (the target's corpus, transformers and dflash for training) into
    ``out``, downloaded once into ``cache`` and checked against their pinned sha256."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)
    import lm_files

    manifest = json.loads(lm_files.PINNED_CORPUS.read_text())
    cache.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    staged = []
    for art in manifest["wheels"] + manifest["training_wheels"]:
        path = cache / art["file"]
        if not path.is_file():
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                            "--dest", str(cache), f"{art['name']}=={art['version']}"], check=True)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != art["sha256"]:
            raise SystemExit(f"{path}: sha256 {digest}, corpus.json pins {art['sha256']}")
        shutil.copy2(path, out / art["file"])
        staged.append(out / art["file"])
    return staged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / ".stage")
    parser.add_argument("--corpus", action="store_true",
                        help="stage the trained target's pinned corpus and training wheels only (corpus.json)")
    parser.add_argument("--extras", nargs="*", type=Path, metavar="CHECKPOINT",
                        help="pack only an extra bundle: FA2 (unless --no-fa2) plus these checkpoint folders")
    parser.add_argument("--extras-name", default="extras", help="its stem (extras-<what>), default extras")
    parser.add_argument("--no-fa2", action="store_true", help="leave FA2 out of the extra bundle")
    parser.add_argument("--wheels", type=Path,
                        help="a folder of wheels/sdists for $SITE_QUANT (e.g. modelopt to quantize there)")
    parser.add_argument("--quant-wheels", action="store_true",
                        help="download quantize-requirements.txt into --out/quant-wheels and pack it as --wheels")
    parser.add_argument("--ray", action="store_true",
                        help=f"pack only the extras-ray bundle: the {RAY_PIN} wheel (remote.sh engine-check's Ray plans)")
    parser.add_argument("--vllm", default=VLLM_VERSION,
                        help=f"the vLLM release to bundle (default {VLLM_VERSION}; others are bundle-<version>)")
    parser.add_argument("--with-fa2", action="store_true",
                        help="keep _vllm_fa2_C in the bundle (instead of an extras-fa2 bundle)")
    parser.add_argument("--resplit", nargs="+", metavar="STEM",
                        help="cut these staged bundles again into parts of --part-mb (nothing downloaded)")
    parser.add_argument("--part-mb", type=float, default=PART_BYTES / 1e6,
                        help="--resplit's part size in MB (default %(default).0f): CALL_BYTES less the tree "
                             "is what one transfer can take beside it")
    args = parser.parse_args(argv)
    out: Path = args.out
    if args.corpus:
        staged = stage_corpus(out / "corpus")
        print(f"corpus: {sum(p.stat().st_size for p in staged) / 1e6:.1f} MB in {out / 'corpus'} "
              "(copy .stage/corpus to the GPU host; remote.sh target-bg)")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    if args.resplit:
        for stem in args.resplit:
            manifest = resplit(out, stem, int(args.part_mb * 1e6))
            print(f"{stem}: {len(manifest['parts'])} parts of at most {args.part_mb:.1f} MB")
        return 0
    if args.ray:
        manifest = pack_extras(None, [], out, "extras-ray", download_ray_wheel(out / "ray-wheel"))
        print(f"extras-ray: {manifest['bytes'] / 1e6:.1f} MB in {len(manifest['parts'])} parts under {out}")
        return 0
    if args.extras is not None:
        if not args.extras_name.startswith("extras"):
            parser.error("--extras-name must start with 'extras' (remote.sh installs extras*)")
        wheel = None if args.no_fa2 else vllm_wheel()
        wheels = download_quant_wheels(out / "quant-wheels") if args.quant_wheels else args.wheels
        manifest = pack_extras(wheel, args.extras, out, args.extras_name, wheels)
        print(f"{args.extras_name}: {manifest['bytes'] / 1e6:.1f} MB in {len(manifest['parts'])} parts under {out}")
        return 0
    stem = bundle_stem(args.vllm)
    wheel = vllm_wheel(args.vllm)
    wheels = download_wheels(out / "wheels-cache", requirements_for(args.vllm))
    build_tree(wheel, wheels, out / "tree", keep_fa2=args.with_fa2)
    tarball = pack(out / "tree", out, stem)
    manifest = split(tarball, out, stem, args.vllm)
    tarball.unlink()
    shutil.rmtree(out / "tree")
    print(f"{stem}: {manifest['bytes'] / 1e6:.1f} MB in {len(manifest['parts'])} parts under {out}")
    for p in manifest["parts"]:
        print(f"  {p['name']}  {p['bytes'] / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
