// Bad pass options fail with forgec's messages, naming the option.
// RUN: not forge-opt %s --forge-build-train-step="loss=mse:y,t optimizer=rmsprop" 2>&1 | FileCheck %s --check-prefix=OPT
// OPT: error: --optimizer: unknown optimizer 'rmsprop'
// RUN: not forge-opt %s --forge-build-train-step="optimizer=sgd" 2>&1 | FileCheck %s --check-prefix=NOLOSS
// NOLOSS: error: training bundles need --loss and --optimizer
// RUN: not forge-opt %s --forge-build-train-step="loss=mse:y,t optimizer=sgd micro-batches=0" 2>&1 | FileCheck %s --check-prefix=MICRO
// MICRO: error: --micro-batches must be >= 1
// RUN: not forge-opt %s --forge-build-train-step="loss=cross_entropy:y,t,prob optimizer=sgd" 2>&1 | FileCheck %s --check-prefix=PROB
// PROB: error: --loss: --loss cross_entropy:OUTPUT,LABEL names a model output and the label input to add (and optionally smoothing=S, probs: the label holds class probabilities, and ignore=N: label N has no loss term)
func.func @main(%x: tensor<2xf32> {forge.name = "x"}) -> (tensor<2xf32> {forge.name = "y"}) {
  return %x : tensor<2xf32>
}
