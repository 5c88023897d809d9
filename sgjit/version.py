"""The package version, on the ground floor so every layer (the server's OpenAPI document, its info
routes) can read it without importing the public API above them."""

__version__ = "0.1.0"
