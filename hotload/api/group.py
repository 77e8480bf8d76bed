"""The API group and version of both CRDs."""

from typing import Final

GROUP: Final = "hotload.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
CATEGORY: Final = "hotload"
