// Job specs the submit form starts from (the contract is shared/design/JOB_SPEC.md).
// Data paths are relative, taken under the first of the service's TOWERBOARD_DATA_ROOTS
// that holds them: /datasets/mnist in docker-compose.yml's container, the data dir's
// datasets/mnist on a host. (Named "/datasets/mnist", the presets were refused on a host.)

export const PRESETS = [
  {
    id: "smoke",
    label: "Synthetic smoke test (MLP, 1 tower, seconds)",
    spec: {
      name: "smoke-test",
      model: { name: "mlp", params: { hidden: [16] } },
      data: { format: "synthetic", params: { shape: [8, 8], classes: 4, size: 256 } },
      towers: 1,
      batch_size: 32,
      steps: 60,
      eval: { every_steps: 20, batches: 2 },
      summaries: { trace_steps: [] },
      checkpoint: { every_steps: 20, every_seconds: 0, keep: 3 },
    },
  },
  {
    id: "mnist-cnn",
    label: "MNIST-style CNN on 2 towers (IDX files in a data root's mnist/)",
    spec: {
      name: "mnist-cnn-2towers",
      model: { name: "cnn", params: { dropout: 0.4 } },
      data: { format: "idx", path: "mnist", eval_fraction: 0.2 },
      towers: 2,
      parameter_device: "cpu",
      batch_size: 256,
      steps: 2000,
      optimizer: {
        name: "adam",
        learning_rate: 0.001,
        schedule: { name: "exponential_decay", decay_steps: 1000, decay_rate: 0.96, staircase: true },
      },
      weight_decay: 0.0001,
      eval: { every_steps: 500, batches: 20 },
      summaries: { scalars_every: 10, histograms_every: 500, images_every: 500, trace_steps: [20, 21, 22] },
      checkpoint: { every_steps: 500, every_seconds: 300, keep: 5 },
    },
  },
  {
    id: "mnist-mlp",
    label: "MLP (784-500-10) on MNIST, 1 tower (IDX files in a data root's mnist/)",
    spec: {
      name: "mnist-mlp",
      model: { name: "mlp", params: { hidden: [500], dropout: 0.2 } },
      data: { format: "idx", path: "mnist" },
      towers: 1,
      batch_size: 128,
      epochs: 5,
      optimizer: { name: "momentum", learning_rate: 0.05, momentum: 0.9 },
      eval: { every_steps: 500, batches: 20 },
      checkpoint: { every_steps: 1000, every_seconds: 300, keep: 3 },
    },
  },
];
