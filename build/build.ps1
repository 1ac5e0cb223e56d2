<#
.SYNOPSIS
  Build vLLM wheels natively on Windows for an RTX 5090 (target windows-amd64).

.DESCRIPTION
  Thin on purpose: finds MSVC with vswhere and loads its x64 environment
  (vcvars64.bat), sets DISTUTILS_USE_SDK=1 and VLLM_TARGET_DEVICE=cuda, warns
  when long paths are off, prepares a venv holding this launcher, then runs
  `launcher build wheels --target windows-amd64 <your arguments>`.
  The plan, preflight and build live in launcher/builder/.

  Upstream vLLM does not build on Windows: pass a checkout of
  SystemPanic/vllm-windows with --source. Faster route without a build:
  `launcher install --wheel <a vllm-windows wheel>` (installs it, applies the series).

.EXAMPLE
  build\build.ps1 --source C:\src\vllm-windows --output-dir C:\b\dist
.EXAMPLE
  build\build.ps1 plan
#>
param([Parameter(ValueFromRemainingArguments = $true)][string[]]$LauncherArgs)

$ErrorActionPreference = "Stop"
$Repo = Split-Path -Parent $PSScriptRoot

$Command = "wheels"
if ($LauncherArgs.Count -gt 0 -and @("plan", "preflight", "wheels", "targets") -contains $LauncherArgs[0]) {
    $Command = $LauncherArgs[0]
    $LauncherArgs = @($LauncherArgs | Select-Object -Skip 1)
}

# MSVC: the newest Visual Studio with the x64 C++ tools, found by vswhere.
$VsWhere = Join-Path ${env:ProgramFiles(x86)} "Microsoft Visual Studio\Installer\vswhere.exe"
if (-not (Test-Path $VsWhere)) {
    throw "vswhere.exe not found: install Visual Studio 2022 Build Tools with 'Desktop development with C++'"
}
$VsPath = & $VsWhere -latest -products * -requires Microsoft.VisualStudio.Component.VC.Tools.x86.x64 -property installationPath
if (-not $VsPath) {
    throw "no Visual Studio with the x64 C++ tools: add 'Desktop development with C++' in the Visual Studio Installer"
}
$VcVars = Join-Path $VsPath "VC\Auxiliary\Build\vcvars64.bat"
cmd /c "`"$VcVars`" >nul && set" | ForEach-Object {
    if ($_ -match "^([^=]+)=(.*)$") { Set-Item -Path "env:$($Matches[1])" -Value $Matches[2] }
}
if ($LASTEXITCODE -ne 0) { throw "vcvars64.bat failed ($VcVars)" }

$env:DISTUTILS_USE_SDK = "1"
$env:VLLM_TARGET_DEVICE = "cuda"

$LongPaths = (Get-ItemProperty -Path "HKLM:\SYSTEM\CurrentControlSet\Control\FileSystem" -Name LongPathsEnabled -ErrorAction SilentlyContinue).LongPathsEnabled
if ($LongPaths -ne 1) {
    Write-Warning ("Long paths are off: the build may fail on deep paths. As admin: " +
        "Set-ItemProperty HKLM:\SYSTEM\CurrentControlSet\Control\FileSystem LongPathsEnabled 1; " +
        "git config --system core.longpaths true. Or keep --work-dir short (e.g. C:\b).")
}

$Venv = if ($env:BUILD_VENV) { $env:BUILD_VENV } else { Join-Path $env:LOCALAPPDATA "vllm-sm12x\build-venv" }
$Python = if ($env:PYTHON) { $env:PYTHON } else { "python" }
if (-not (Test-Path (Join-Path $Venv "Scripts\python.exe"))) {
    Write-Host "build.ps1: creating $Venv"
    & $Python -m venv $Venv
    if ($LASTEXITCODE -ne 0) { throw "could not create the venv with $Python" }
}
& (Join-Path $Venv "Scripts\python.exe") -m pip install --quiet --upgrade pip
if ($LASTEXITCODE -ne 0) { throw "pip upgrade failed" }
& (Join-Path $Venv "Scripts\python.exe") -m pip install --quiet $Repo
if ($LASTEXITCODE -ne 0) { throw "installing the launcher failed" }

$TargetArgs = @()
if ($Command -ne "targets" -and -not ($LauncherArgs -contains "--target" -or $LauncherArgs -contains "-t")) {
    $TargetArgs = @("--target", "windows-amd64")
}
& (Join-Path $Venv "Scripts\launcher.exe") build $Command @TargetArgs @LauncherArgs
exit $LASTEXITCODE
