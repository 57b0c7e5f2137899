# syntax=docker/dockerfile:1
# The step image: what every Argo step of ckptflow runs (`python -m steps.NAME`, torchrun for
# the training ranks) plus the `ckptflow` CLI (render, submit, ckpt gc for retention).
#
#   make image                       # CPU (default): torch from PyTorch's CPU wheel index
#   make image-cuda                  # CUDA: PyPI's Linux torch wheels, which bundle CUDA
#   docker build -f images/step.Dockerfile -t ckptflow-steps:0.1.0 .     # the same by hand
#
# Versions are the tested ones: torch and the step dependencies are pinned in pyproject.toml,
# the rest of what pip resolves in images/constraints.txt. Build context: the repository root
# (.dockerignore lets in only what is copied below).
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# Where torch comes from: the CPU index keeps the image ~1 GB smaller than a CUDA build.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/ckptflow
ENV PATH=/opt/ckptflow/bin:$PATH
# torch first, from its own index: installed later from PyPI, an unpinned resolver would pick
# PyPI's CUDA build. 2.13.0+cpu satisfies the project's torch==2.13.0.
RUN pip install --index-url "${TORCH_INDEX_URL}" torch==2.13.0
WORKDIR /src
COPY images/constraints.txt images/constraints.txt
COPY pyproject.toml README.md ./
COPY ckptflow/ ckptflow/
COPY steps/ steps/
COPY workflows/ workflows/
RUN pip install --constraint images/constraints.txt ".[steps,workflows]" \
 && find /opt/ckptflow -name __pycache__ -type d -prune -exec rm -rf {} +

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="ckptflow-steps" \
      org.opencontainers.image.description="ckptflow steps and CLI" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/ckptflow /opt/ckptflow
ENV PATH=/opt/ckptflow/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# A fixed numeric non-root user, so Kubernetes' runAsNonRoot can verify it.
RUN useradd --uid 1000 --user-group --create-home --shell /usr/sbin/nologin ckptflow
USER 1000:1000
WORKDIR /home/ckptflow
# Every entrypoint the workflows run (the steps of docs/contracts.md, the rendezvous daemon,
# torchrun and the CLI) must import and parse its arguments here, so a missing module or
# dependency fails the build rather than a workflow.
ARG STEP_MODULES="ckptflow.steps.start_run ckptflow.steps.pretrain ckptflow.steps.evaluate ckptflow.steps.finetune ckptflow.steps.select ckptflow.steps.finish_run ckptflow.steps.rdzv ckptflow.steps.drill"
RUN for m in ${STEP_MODULES}; do python -m "$m" --help > /dev/null || exit 1; done \
 && python -m torch.distributed.run --help > /dev/null \
 && python -m ckptflow.cli --help > /dev/null
CMD ["python", "-m", "ckptflow.cli", "--help"]
