"""Build planning, toolchain preflight and wheel builds for sm_120 / sm_121."""
