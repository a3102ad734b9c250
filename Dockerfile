# Towerboard on a GPU host: the service, its job workers and its TensorBoard in one
# container (docker-compose.yml runs it). The official TensorFlow GPU image brings CUDA,
# cuDNN and TensorFlow 2.21.0, the version pyproject.toml pins; pip adds the rest of the
# pinned dependencies around it and never reinstalls TensorFlow.
FROM tensorflow/tensorflow:2.21.0-gpu

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TF_CPP_MIN_LOG_LEVEL=1

WORKDIR /opt/towerboard

# Dependencies first (their own layer, kept while only the code changes): everything
# pyproject.toml pins except TensorFlow, with TensorFlow as the image has it held as a
# constraint so that nothing can pull in another build of it.
COPY pyproject.toml README.md ./
RUN python -c "import tomllib; deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; print('\n'.join(d for d in deps if not d.startswith('tensorflow==')))" > /tmp/requirements.txt \
 && python -c "import importlib.metadata as m; print('tensorflow==' + m.version('tensorflow'))" > /tmp/constraints.txt \
 && python -m pip install -r /tmp/requirements.txt -c /tmp/constraints.txt \
 && python -c "import importlib.metadata as m; v = m.version('tensorflow'); assert v == '2.21.0', v"

# The code, installed in place (editable): the service serves static/ from beside service/.
COPY service ./service
COPY trainer ./trainer
COPY static ./static
RUN python -m pip install --no-deps -e . \
 && useradd --create-home --uid 1000 towerboard \
 && mkdir -p /var/lib/towerboard /datasets \
 && chown towerboard:towerboard /var/lib/towerboard

USER towerboard
# The job store, runs, checkpoints and TensorBoard logs; mount a volume here.
VOLUME ["/var/lib/towerboard"]
ENV TOWERBOARD_DATA_DIR=/var/lib/towerboard \
    TOWERBOARD_DATA_ROOTS=/datasets
EXPOSE 8000

HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]

CMD ["towerboard", "serve", "--host", "0.0.0.0", "--port", "8000", "--data-dir", "/var/lib/towerboard"]
