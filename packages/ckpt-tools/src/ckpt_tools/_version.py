"""The package's version, in a leaf module: hatch reads it from here (pyproject's `[tool.hatch.version]`),
and the package, `ckpt --version` and the Hub client's user agent import it without reaching up to the
package root."""

__version__ = "0.1.0"
