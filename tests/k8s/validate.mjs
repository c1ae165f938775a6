// Validate Kubernetes objects against their API schemas (kubernetes-models' JSON schemas):
// reads a JSON array of objects on stdin, prints one JSON line per object: {"kind", "name", "error"}.
// Used by tests/cli/test_scaling_manifests.py; `npm ci` in this folder installs what it needs.
import { readFileSync } from "node:fs";

const models = {
  "keda.sh/v1alpha1/ScaledObject": "@kubernetes-models/keda/keda.sh/v1alpha1/ScaledObject",
  "autoscaling/v2/HorizontalPodAutoscaler": "kubernetes-models/autoscaling/v2/HorizontalPodAutoscaler",
  "apps/v1/Deployment": "kubernetes-models/apps/v1/Deployment",
  "v1/Service": "kubernetes-models/v1/Service",
};

const objects = JSON.parse(readFileSync(0, "utf8"));
for (const object of objects) {
  const key = `${object.apiVersion}/${object.kind}`;
  const line = { kind: key, name: object.metadata?.name ?? null, error: null };
  const module = models[key];
  if (!module) {
    line.error = `no schema for ${key}`;
  } else {
    const Model = Object.values(await import(module)).find((v) => typeof v === "function");
    try {
      new Model(object).validate();
    } catch (e) {
      line.error = String(e.message ?? e);
    }
  }
  console.log(JSON.stringify(line));
}
