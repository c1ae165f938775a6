# tfservo as a container: `docker run IMAGE serve` (SageMaker's bring-your-own-container
# contract, bundle at /opt/ml/model, port 8080), `docker run IMAGE tensorflow_model_server ...`
# (TF Serving's flags, KServe's kserve-tensorflow-serving runtime), MODEL_NAME/MODEL_BASE_PATH
# as in TF Serving's image.
#
# Built without a registry or PyPI inside the build: BASE is any Debian bookworm image (the
# image test makes one with debootstrap + docker import), Python packages come from a wheelhouse
# made on the host (`pip download -r requirements.lock -d wheelhouse`), apt from
# Debian's mirror (build with --network host). scripts/build-image does all of it.
ARG BASE=debian:bookworm-slim
FROM ${BASE}

RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/*

COPY wheelhouse /wheels
COPY requirements.lock /src/requirements.lock
RUN python3 -m venv /opt/tfservo \
 && /opt/tfservo/bin/pip install --no-cache-dir --no-index --find-links /wheels -r /src/requirements.lock
COPY pyproject.toml README.md /src/
COPY tfservo /src/tfservo
RUN /opt/tfservo/bin/pip install --no-cache-dir --no-index --find-links /wheels --no-deps /src \
 && rm -rf /wheels /src
COPY deploy/entrypoint.sh /opt/tfservo/bin/tfservo-entrypoint
# `serve` on PATH too, for platforms that run the command without the image's entrypoint
RUN ln -s tfservo-entrypoint /opt/tfservo/bin/serve

RUN useradd --system --uid 1000 --create-home tfservo \
 && mkdir -p /opt/ml/model /models \
 && chown -R tfservo /opt/ml /models

ENV PATH=/opt/tfservo/bin:$PATH \
    TF_CPP_MIN_LOG_LEVEL=2 \
    MODEL_BASE_PATH=/models \
    PYTHONDONTWRITEBYTECODE=1
USER tfservo
WORKDIR /home/tfservo
EXPOSE 8080 8500 8501 9000
ENTRYPOINT ["tfservo-entrypoint"]
CMD ["serve"]
