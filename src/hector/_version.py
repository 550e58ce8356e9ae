"""The package version, in a leaf module: the kernel cache hashes it without importing the
package root (which imports the compiler)."""
__version__ = "0.1.0"
