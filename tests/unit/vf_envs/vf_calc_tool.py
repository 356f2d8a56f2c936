"""The ``calc`` environment's tool server (verifiers runs it as ``python -m`` this module)."""

import verifiers.v1 as vf


class CalcToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "calc"

    @vf.tool
    def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b


if __name__ == "__main__":
    CalcToolset.run()
