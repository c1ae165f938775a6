"""GET /docs: Swagger UI over /openapi.json, its assets served from the swagger-ui-py package
(Swagger UI 5, which reads OpenAPI 3.1; no CDN at run time), with "Try it out" on so a request
can be sent from the page."""

from __future__ import annotations

from importlib.resources import files

from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

__all__ = ["ASSETS_PATH", "DOCS_PATH", "docs_routes"]

DOCS_PATH = "/docs"
ASSETS_PATH = "/docs/assets"

# Relative URLs, so the page works behind a proxy that mounts the server under a prefix.
_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
  <meta charset="UTF-8">
  <title>tfservo API</title>
  <link rel="stylesheet" type="text/css" href="docs/assets/swagger-ui.css">
  <link rel="icon" type="image/png" href="docs/assets/favicon-32x32.png" sizes="32x32">
</head>
<body>
  <div id="swagger-ui"></div>
  <script src="docs/assets/swagger-ui-bundle.js" charset="UTF-8"></script>
  <script>
    window.ui = SwaggerUIBundle({
      url: "openapi.json",
      dom_id: "#swagger-ui",
      deepLinking: true,
      tryItOutEnabled: true,
      displayRequestDuration: true,
      validatorUrl: null,
      presets: [SwaggerUIBundle.presets.apis],
      layout: "BaseLayout"
    });
  </script>
</body>
</html>
"""


async def _page(request: Request) -> HTMLResponse:
    return HTMLResponse(_PAGE, headers={"Cache-Control": "no-cache"})


def docs_routes() -> list[BaseRoute]:
    """GET /docs and its static assets."""
    # The package's static folder (its only part used here; a new version is checked by the test).
    assets = str(files("swagger_ui") / "static")
    return [
        Route(DOCS_PATH, _page, methods=["GET"]),
        Mount(ASSETS_PATH, app=StaticFiles(directory=assets), name="docs-assets"),
    ]
