"""GET /docs: Swagger UI over /openapi.json, its assets served from the swagger-ui-py package
(Swagger UI 5, which reads OpenAPI 3.1; no CDN at run time), with "Try it out" on so a request
can be sent from the page."""

from __future__ import annotations

from importlib.resources import files

from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

__all__ = ["DocsPage"]

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


class DocsPage:
    """GET /docs and its static assets (paths in routes.ROUTES)."""

    def __init__(self) -> None:
        # The package's static folder (its only part used here; a new version is checked by the test).
        self.assets = StaticFiles(directory=str(files("swagger_ui") / "static"))

    async def page(self, request: Request) -> HTMLResponse:
        return HTMLResponse(_PAGE, headers={"Cache-Control": "no-cache"})
