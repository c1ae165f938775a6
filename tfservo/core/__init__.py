"""The core every front door asks: settings, errors, the service factory, the invocation path
(model, version and method chosen in one place) and the typed data plane. No protocol here."""
