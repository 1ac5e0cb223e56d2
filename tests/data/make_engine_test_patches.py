"""Regenerate the engine's test series (tests/data/patches/) from the released sdists.

Real ``git diff`` output against real vLLM files, so the tests exercise the
format the project's series use. Run: .venv/bin/python tests/data/make_engine_test_patches.py
"""
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

WORK = Path(tempfile.mkdtemp(prefix="sm12x-gen-"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from launcher.pypi import unpacked  # noqa: E402

OUT = Path(__file__).resolve().parent / "patches" / "vllm"
HEAD = """Subject: {subject}
Fixes: (engine test patch) {fixes}
Upstream-Status: Inappropriate [test data for the patch engine]
Applies-To: vllm {version}

{desc}
"""
def git(*a, cwd): return subprocess.run(["git",*a], cwd=cwd, check=True, capture_output=True, text=True).stdout

def make(version, name, files, edit, subject, fixes, desc, sub=""):
    repo = WORK / f"repo-{version}"
    out = OUT/version/sub
    out.mkdir(parents=True, exist_ok=True)
    edit(repo)
    git("add","-A",cwd=repo)
    diff = git("diff","--cached","--binary",cwd=repo)
    git("commit","-qm",name,cwd=repo)
    (out/name).write_text(HEAD.format(subject=subject,fixes=fixes,version=version,desc=desc)+"\n"+diff)
    with open(out/"series","a") as fh: fh.write(name+"\n")

for version in ["0.21.0","0.33.0"]:
    repo = WORK / f"repo-{version}"
    shutil.rmtree(repo, ignore_errors=True)
    src = unpacked("vllm", version, "source")
    (repo/"vllm/v1/attention").mkdir(parents=True)
    shutil.copy(src/"vllm/v1/attention/backend.py", repo/"vllm/v1/attention/backend.py")
    shutil.copy(src/"CMakeLists.txt", repo/"CMakeLists.txt")
    git("init","-q",cwd=repo); git("add","-A",cwd=repo); git("-c","user.name=t","-c","user.email=t@t","commit","-qm","pristine",cwd=repo)
    os.environ.update(GIT_AUTHOR_NAME="t",GIT_AUTHOR_EMAIL="t@t",GIT_COMMITTER_NAME="t",GIT_COMMITTER_EMAIL="t@t")
    for f in ["series","build/series"]:
        p = OUT/version/f
        if p.exists(): p.unlink()
    b = repo/"vllm/v1/attention/backend.py"
    def e1(repo):
        s = b.read_text()
        a = "    forward_includes_kv_cache_update: bool = True\n"
        assert s.count(a)==1
        s = s.replace(a, a+"\n    # Engine test patch: marks the backend class as patched.\n    sm12x_patched: ClassVar[bool] = True\n")
        a2 = "    @classmethod\n    def supports_sink(cls) -> bool:\n        return False\n"
        assert s.count(a2)==1
        s = s.replace(a2, a2+"\n    @classmethod\n    def sm12x_probe(cls) -> str:\n        return \"sm12x\"\n")
        b.write_text(s)
    make(version,"0001-backend-two-hunks.patch",None,e1,"Mark AttentionBackend as patched (two hunks)","none","Two hunks in vllm/v1/attention/backend.py, far apart.")
    def e2(repo):
        d = repo/"vllm/sm12x_selftest"; d.mkdir()
        (d/"__init__.py").write_text('"""Created by the engine test series; removed on revert."""\n\nPATCHED = True\n')
    make(version,"0002-new-module.patch",None,e2,"Add the vllm.sm12x_selftest package","none","Creates a new file in a new folder.")
    def e3(repo):
        s = b.read_text()
        a = "    sm12x_patched: ClassVar[bool] = True\n"
        s = s.replace(a, a+"    sm12x_series: ClassVar[str] = \"engine-test\"\n")
        b.write_text(s)
    make(version,"0003-backend-on-top.patch",None,e3,"Name the series on AttentionBackend","none","Its context holds a line that 0001 adds: it only fits after 0001.")
    def e4(repo):
        c = repo/"CMakeLists.txt"; s = c.read_text()
        a = 'message(STATUS "Target device: ${VLLM_TARGET_DEVICE}")\n'
        assert s.count(a)==1
        c.write_text(s.replace(a, a+'message(STATUS "sm12x engine test build patch")\n'))
    make(version,"0001-cmake-message.patch",None,e4,"Print a line from CMake","none","A build patch: source trees only.",sub="build")
