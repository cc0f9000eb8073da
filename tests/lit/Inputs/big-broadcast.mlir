func.func @main() -> tensor<100000x100000xf32> {
  %c = forge.constant dense<1.0> : tensor<f32>
  %b = forge.broadcast %c {shape = array<i64: 100000, 100000>} : (tensor<f32>) -> tensor<100000x100000xf32>
  return %b : tensor<100000x100000xf32>
}
