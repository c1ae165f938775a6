"""GET /docs: Swagger UI over /openapi.json, its assets served from the swagger-ui-py package
(Swagger UI 5, which reads OpenAPI 3.1; no CDN at run time), with "Try it out" on so a request
can be sent from the page."""

from __future__ import annotations

from importlib.resources import files

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from tfservo.core.extras import MissingExtra, require
from tfservo.http.responses import error_json

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
        try:
            require("GET /docs", "ui", "swagger_ui")
        except MissingExtra as exc:
            self.missing: MissingExtra | None = exc
            self.assets: ASGIApp = self._missing_assets
            return
        self.missing = None
        # The package's static folder (its only part used here; a new version is checked by the test).
        self.assets = StaticFiles(directory=str(files("swagger_ui") / "static"))

    async def page(self, request: Request) -> Response:
        if self.missing is not None:
            return await self._missing(request)
        return HTMLResponse(_PAGE, headers={"Cache-Control": "no-cache"})

    async def _missing(self, request: Request) -> Response:
        """The lean install has no Swagger UI: say so, and where the API description is."""
        return error_json(f"{self.missing}; GET /openapi.json describes the API without it", 404)

    async def _missing_assets(self, scope: Scope, receive: Receive, send: Send) -> None:
        await (await self._missing(Request(scope)))(scope, receive, send)
