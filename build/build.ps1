<#
.SYNOPSIS
  Build vLLM wheels natively on Windows for an RTX 5090 (target windows-amd64).

.DESCRIPTION
  A thin wrapper: prepares a venv holding this launcher, then runs
  `launcher build wheels --target windows-amd64 <your arguments>`. The launcher
  does the rest (launcher/builder/): finds MSVC with vswhere and loads its x64
  environment (vcvars64.bat), warns when long paths are off, plans, checks
  and builds.

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
