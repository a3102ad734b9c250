# Sourced on a GPU host from the repository's root, after bench/gpu_pack.py's pieces have
# been gathered in $PIECES: installs TensorFlow and the wheels under /tmp/tb-site, sets
# PYTHONPATH and LD_LIBRARY_PATH for python3 and the workers it starts, and checks that
# TensorFlow sees the GPU and runs a matrix product and a convolution there. Takes about
# 10 seconds. Needs a python3 whose site-packages hold NVIDIA's CUDA 13 cuBLAS and cuDNN 9
# wheels (a CUDA image's PyTorch brings them).
kit="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
site=/tmp/tb-site cuda=/tmp/tb-cuda
mkdir -p "$site" "$cuda"
if ! cat "${PIECES:?set PIECES to the folder holding the pieces}"/* | xz -d -T0 | tar -C "$site" -xf -; then
    echo "gpu_setup: could not unpack the pieces in $PIECES (all of them there?)" >&2
    return 1
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" "$kit"/whl/*.whl || return 1
cp "$kit"/lib/* "$cuda"/
host_site="$(python3 -c 'import site; print(site.getsitepackages()[0])')"
cublas="$(dirname "$(find "$host_site" -name 'libcublas.so.13' | head -1)")"
cudnn="$(dirname "$(find "$host_site" -name 'libcudnn.so.9' | head -1)")"
# TensorFlow opens cuBLAS by its CUDA 12 names and looks each function up by name.
ln -sf "$cublas/libcublas.so.13" "$cuda/libcublas.so.12"
ln -sf "$cublas/libcublasLt.so.13" "$cuda/libcublasLt.so.12"
export LD_LIBRARY_PATH="$cuda:$cudnn:$cublas" PYTHONPATH="$site" PYTHONUNBUFFERED=1
export TF_CPP_MIN_LOG_LEVEL=2
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 - <<'PY' || return 1
import tensorflow as tf

gpus = tf.config.list_physical_devices("GPU")
if not gpus:
    raise SystemExit("gpu_setup: TensorFlow sees no GPU (its log above says why)")
with tf.device("/GPU:0"):
    a = tf.random.normal([512, 512])
    x, k = tf.random.normal([8, 28, 28, 1]), tf.random.normal([3, 3, 1, 32])
    checks = (tf.reduce_sum(tf.matmul(a, a)), tf.reduce_sum(tf.nn.conv2d(x, k, 1, "SAME")))
print(f"TensorFlow {tf.__version__} on {gpus[0].name}: matmul and conv2d ran,",
      [round(float(c), 2) for c in checks])
PY
