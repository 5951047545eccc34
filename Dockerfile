# clockq's image: every role runs from it (`python manage.py runstack --role ROLE`, clockq/stack/).
# It sits at the top of the repository because the whole checkout is its build context, so a
# plain `docker build .` works, and Docker reads .dockerignore from the context's root.
#
#   docker build -t clockq .                                                  # web, beat, control, predictor, flower
#   docker build --build-arg REQUIREMENTS=requirements-gpu.txt -t clockq-gpu .   # the gpu role (CUDA TensorFlow)
#
# compose/compose.yaml builds both; docs/deploy.md says how to run them.
FROM python:3.11-slim-bookworm

# requirements.txt: TensorFlow's CPU build; requirements-gpu.txt: its CUDA build, whose NVIDIA
# libraries come as wheels (the host needs only the driver and the NVIDIA Container Toolkit).
ARG REQUIREMENTS=requirements.txt

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# tini is PID 1: it passes SIGTERM to runstack (which stops its roles, GPU workers after a
# checkpoint) and reaps orphans. bubblewrap is the sandbox of command jobs (workers/sandbox.py).
# Debian's versions follow the base image's release; they are not pinned one by one.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini bubblewrap \
 && rm -rf /var/lib/apt/lists/*

RUN groupadd --system --gid 10001 clockq \
 && useradd --system --uid 10001 --gid clockq --home-dir /var/lib/clockq --no-create-home clockq

WORKDIR /app
# The pinned requirements first, so that a change of code reuses the layer with the packages.
COPY requirements-base.txt requirements.txt requirements-gpu.txt ./
RUN pip install --no-cache-dir -r "$REQUIREMENTS"

COPY . .

# The static files, gzipped, into var/static (WhiteNoise serves them). Settings would keep a
# generated SECRET_KEY and broker password in var/ when none is given: build-only stand-ins keep
# any secret out of the image.
RUN CLOCKQ_VAR_DIR=/var/lib/clockq/var \
    SECRET_KEY=build-only-stand-in-never-used-at-run-time \
    REDIS_URL=redis://build.invalid:6379/0 \
    python manage.py collectstatic --noinput --verbosity 0 \
 && mkdir -p /var/lib/clockq/checkpoints /var/lib/clockq/models \
 && chown -R clockq:clockq /var/lib/clockq

# Each role's own settings (DATABASE_URL, REDIS_URL, SECRET_KEY, ... or their *_FILE forms) come
# from the deployment. The checkpoint folder is a volume: shared storage with several hosts.
ENV CLOCKQ_VAR_DIR=/var/lib/clockq/var \
    CLOCKQ_CHECKPOINT_DIR=/var/lib/clockq/checkpoints \
    CLOCKQ_MODEL_DIR=/var/lib/clockq/models \
    CLOCKQ_BIND=0.0.0.0 \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

# Numeric, so that Kubernetes can check runAsNonRoot against it.
USER 10001:10001
EXPOSE 8000 5555
ENTRYPOINT ["tini", "--"]
CMD ["python", "manage.py", "runstack", "--role", "web"]
