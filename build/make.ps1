<#
.SYNOPSIS
  The README's two commands on Windows, where there is no make: `make serve` and `make test`.

.DESCRIPTION
  A thin wrapper: finds Python ($env:PYTHON, else py -3, else python) and runs build\make.py,
  which does what the Makefile's targets of the same names do, with the same NAME=VALUE
  variables. Its exit code is the command's own (launcher serve: 2 when the preflight
  blocks, 0 for a dry run that printed its plan).

.EXAMPLE
  build\make.ps1 serve
.EXAMPLE
  build\make.ps1 serve ARGS=--dry-run RECIPE=gemma4-e4b
.EXAMPLE
  build\make.ps1 test PYTEST_ARGS="tests/unit -x"
#>
$ErrorActionPreference = "Stop"
$MakePy = Join-Path $PSScriptRoot "make.py"

$Python = @()
if ($env:PYTHON) { $Python = @($env:PYTHON) }
elseif (Get-Command py -ErrorAction SilentlyContinue) { $Python = @("py", "-3") }
elseif (Get-Command python -ErrorAction SilentlyContinue) { $Python = @("python") }
else { throw "no Python found: install Python 3.11+ (python.org) or set PYTHON" }

$Exe = $Python[0]
$PyArgs = @($Python | Select-Object -Skip 1)
if (-not $env:PYTHON) { $env:PYTHON = $Exe }  # make.py makes .venv with the same Python
& $Exe @PyArgs $MakePy @args
exit $LASTEXITCODE
