#!/bin/sh
# The image's entrypoint. `serve` is what SageMaker runs (docker run IMAGE serve): tfservo serve
# on all interfaces, port $SAGEMAKER_BIND_TO_PORT or 8080, the bundle at /opt/ml/model.
# `tensorflow_model_server ...` is TF Serving's command line (KServe's runtime, TF Serving's
# docs); with no flags and MODEL_NAME set it starts as TF Serving's image does. Anything else
# runs as given (tfservo transform, a shell).
set -e
case "${1:-serve}" in
  serve)
    [ "$#" -gt 0 ] && shift
    exec tfservo serve --host 0.0.0.0 "$@"
    ;;
  tensorflow_model_server)
    shift
    if [ "$#" -eq 0 ] && [ -n "${MODEL_NAME:-}" ]; then
      exec tensorflow_model_server --port=8500 --rest_api_port=8501
    fi
    exec tensorflow_model_server "$@"
    ;;
  *)
    exec "$@"
    ;;
esac
