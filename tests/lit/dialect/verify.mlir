// RUN: forge-opt %s --split-input-file --verify-diagnostics

func.func @conv_channels(%x: tensor<1x3x8x8xf32>, %w: tensor<4x2x3x3xf32>) -> tensor<1x4x6x6xf32> {
  // expected-error @+1 {{input channels 3 != weight channels 2 x group 1}}
  %y = forge.conv %x, %w {strides = array<i64: 1, 1>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>, group = 1 : i64} : (tensor<1x3x8x8xf32>, tensor<4x2x3x3xf32>) -> tensor<1x4x6x6xf32>
  return %y : tensor<1x4x6x6xf32>
}

// -----

func.func @bad_broadcast(%a: tensor<3xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+2 {{operand shapes are not broadcast-compatible}}
  // expected-error @+1 {{failed to infer returned types}}
  %y = forge.add %a, %b : (tensor<3xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %y : tensor<4xf32>
}

// -----

func.func @wrong_result_type(%a: tensor<2x3xf32>, %b: tensor<3x5xf32>) -> tensor<2x4xf32> {
  // expected-error @+2 {{'forge.matmul' op inferred type(s) 'tensor<2x5xf32>' are incompatible with return type(s) of operation 'tensor<2x4xf32>'}}
  // expected-error @+1 {{failed to infer returned types}}
  %y = forge.matmul %a, %b : (tensor<2x3xf32>, tensor<3x5xf32>) -> tensor<2x4xf32>
  return %y : tensor<2x4xf32>
}

// -----

func.func @not_a_permutation(%x: tensor<2x3xf32>) -> tensor<2x2xf32> {
  // expected-error @+1 {{perm is not a permutation}}
  %t = forge.transpose %x {perm = array<i64: 0, 0>} : (tensor<2x3xf32>) -> tensor<2x2xf32>
  return %t : tensor<2x2xf32>
}

// -----

func.func @slice_not_normalized(%x: tensor<4xf32>) -> tensor<2xf32> {
  // expected-error @+1 {{dim 0: start 3, end 1, step 1 not normalized for extent 4}}
  %s = forge.slice %x {starts = array<i64: 3>, ends = array<i64: 1>, steps = array<i64: 1>} : (tensor<4xf32>) -> tensor<2xf32>
  return %s : tensor<2xf32>
}

// -----

func.func @mixed_types(%a: tensor<3xf32>, %b: tensor<3xi64>) -> tensor<3xf32> {
  // expected-error @+2 {{operand element types differ}}
  // expected-error @+1 {{failed to infer returned types}}
  %y = forge.add %a, %b : (tensor<3xf32>, tensor<3xi64>) -> tensor<3xf32>
  return %y : tensor<3xf32>
}

// -----

// Fusion regions: a loop region holds only pointwise ops of its iteration shape.
func.func @fusion_not_pointwise(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  %r = forge.fusion "loop"(%x) : (tensor<2x4xf32>) -> tensor<2x4xf32> {
  ^bb0(%a: tensor<2x4xf32>):
    // expected-error @+1 {{is not pointwise (FusionClass Elementwise) and cannot be in a loop region}}
    %s = forge.softmax %a {axis = 1 : i64} : (tensor<2x4xf32>) -> tensor<2x4xf32>
    forge.yield %s : tensor<2x4xf32>
  }
  return %r : tensor<2x4xf32>
}

// -----

// A norm_grad region begins with its layer_norm_grad on its first three
// arguments (it may yield dx: other ops read it too).
func.func @norm_grad_without_norm(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{norm_grad region must begin with a layer_norm_grad of its first three arguments}}
  %r = forge.fusion "norm_grad"(%x) : (tensor<4x8xf32>) -> tensor<4x8xf32> {
  ^bb0(%a: tensor<4x8xf32>):
    %e = forge.exp %a : (tensor<4x8xf32>) -> tensor<4x8xf32>
    forge.yield %e : tensor<4x8xf32>
  }
  return %r : tensor<4x8xf32>
}

// -----

func.func @fusion_unknown_kind(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{has unknown kind 'tile' (loop, row, batch_norm, norm_grad, horizontal, multi_reduce, gemm, lines)}}
  %r = forge.fusion "tile"(%x) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>):
    %e = forge.exp %a : (tensor<4xf32>) -> tensor<4xf32>
    forge.yield %e : tensor<4xf32>
  }
  return %r : tensor<4xf32>
}

// -----

func.func @fusion_input_not_broadcastable(%x: tensor<3xf32>, %y: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{input of shape [3] does not broadcast to the iteration shape}}
  %r = forge.fusion "loop"(%x, %y) : (tensor<3xf32>, tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<3xf32>, %c: tensor<4xf32>):
    %e = forge.exp %c : (tensor<4xf32>) -> tensor<4xf32>
    forge.yield %e : tensor<4xf32>
  }
  return %r : tensor<4xf32>
}

// -----

func.func @fusion_argument_types(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{input 0 has type 'tensor<4xf32>' but body argument 0 has type 'tensor<4xf16>'}}
  %r = forge.fusion "loop"(%x) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf16>):
    %e = forge.cast %a {to = f32} : (tensor<4xf16>) -> tensor<4xf32>
    forge.yield %e : tensor<4xf32>
  }
  return %r : tensor<4xf32>
}

// -----

func.func @horizontal_member_reads_outside(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  %r:2 = forge.fusion "horizontal"(%x) : (tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  ^bb0(%a: tensor<4xf32>):
    %e = forge.fusion "loop"(%a) : (tensor<4xf32>) -> tensor<4xf32> {
    ^bb0(%b: tensor<4xf32>):
      %n = forge.exp %b : (tensor<4xf32>) -> tensor<4xf32>
      forge.yield %n : tensor<4xf32>
    }
    // expected-error @+1 {{reads a value that is neither an argument of its horizontal region nor, for a loop region of one-element results, a sum of an earlier multi_reduce member (members must be independent)}}
    %m = forge.fusion "loop"(%e) : (tensor<4xf32>) -> tensor<4xf32> {
    ^bb0(%b: tensor<4xf32>):
      %n = forge.neg %b : (tensor<4xf32>) -> tensor<4xf32>
      forge.yield %n : tensor<4xf32>
    }
    forge.yield %e, %m : tensor<4xf32>, tensor<4xf32>
  }
  return %r#0, %r#1 : tensor<4xf32>, tensor<4xf32>
}

// -----

// A multi_reduce member's sums may be read by one-element loop members
// (forge-merge-reductions), not by a member over a whole tensor.
func.func @horizontal_sum_read_by_tensor_member(%x: tensor<4xf32>, %y: tensor<4xf32>) -> (tensor<f32>, tensor<4xf32>) {
  %r:2 = forge.fusion "horizontal"(%x, %y) : (tensor<4xf32>, tensor<4xf32>) -> (tensor<f32>, tensor<4xf32>) {
  ^bb0(%a: tensor<4xf32>, %c: tensor<4xf32>):
    %s = forge.fusion "multi_reduce"(%a) : (tensor<4xf32>) -> tensor<f32> {
    ^bb0(%b: tensor<4xf32>):
      %n = forge.reduce_sum %b {axes = array<i64: 0>, keepdims = false} : (tensor<4xf32>) -> tensor<f32>
      forge.yield %n : tensor<f32>
    }
    // expected-error @+1 {{reads a value that is neither an argument of its horizontal region}}
    %m = forge.fusion "loop"(%c, %s) : (tensor<4xf32>, tensor<f32>) -> tensor<4xf32> {
    ^bb0(%b: tensor<4xf32>, %d: tensor<f32>):
      %n = forge.mul %b, %d : (tensor<4xf32>, tensor<f32>) -> tensor<4xf32>
      forge.yield %n : tensor<4xf32>
    }
    forge.yield %s, %m : tensor<f32>, tensor<4xf32>
  }
  return %r#0, %r#1 : tensor<f32>, tensor<4xf32>
}

// -----

// A member of another kind.
func.func @horizontal_row_member(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  %r = forge.fusion "horizontal"(%x) : (tensor<2x4xf32>) -> tensor<2x4xf32> {
  ^bb0(%a: tensor<2x4xf32>):
    // expected-error @+1 {{is not a loop or multi_reduce region; a horizontal region holds those only}}
    %s = forge.fusion "row"(%a) : (tensor<2x4xf32>) -> tensor<2x4xf32> {
    ^bb0(%b: tensor<2x4xf32>):
      %n = forge.softmax %b {axis = 1 : i64} : (tensor<2x4xf32>) -> tensor<2x4xf32>
      forge.yield %n : tensor<2x4xf32>
    }
    forge.yield %s : tensor<2x4xf32>
  }
  return %r : tensor<2x4xf32>
}

// -----

// Row regions: one softmax-family op over the innermost axis.
func.func @row_without_row_op(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  // expected-error @+1 {{row region has no softmax-family op over the innermost axis}}
  %r = forge.fusion "row"(%x) : (tensor<2x4xf32>) -> tensor<2x4xf32> {
  ^bb0(%a: tensor<2x4xf32>):
    %s = forge.softmax %a {axis = 0 : i64} : (tensor<2x4xf32>) -> tensor<2x4xf32>
    forge.yield %s : tensor<2x4xf32>
  }
  return %r : tensor<2x4xf32>
}

// -----

func.func @row_two_row_ops(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  %r = forge.fusion "row"(%x) : (tensor<2x4xf32>) -> tensor<2x4xf32> {
  ^bb0(%a: tensor<2x4xf32>):
    %s = forge.softmax %a {axis = 1 : i64} : (tensor<2x4xf32>) -> tensor<2x4xf32>
    // expected-error @+1 {{is a second row op in one row region}}
    %t = forge.log_softmax %s {axis = 1 : i64} : (tensor<2x4xf32>) -> tensor<2x4xf32>
    forge.yield %t : tensor<2x4xf32>
  }
  return %r : tensor<2x4xf32>
}

// -----

func.func @row_epilogue_reads_prologue(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  %r = forge.fusion "row"(%x) : (tensor<2x4xf32>) -> tensor<2x4xf32> {
  ^bb0(%a: tensor<2x4xf32>):
    %e = forge.exp %a : (tensor<2x4xf32>) -> tensor<2x4xf32>
    %s = forge.softmax %e {axis = 1 : i64} : (tensor<2x4xf32>) -> tensor<2x4xf32>
    // expected-error @+1 {{is an epilogue op of a row region and reads a prologue value}}
    %m = forge.mul %s, %e : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    forge.yield %m : tensor<2x4xf32>
  }
  return %r : tensor<2x4xf32>
}

// -----

func.func @row_not_pointwise(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  %r = forge.fusion "row"(%x) : (tensor<2x4xf32>) -> tensor<2x4xf32> {
  ^bb0(%a: tensor<2x4xf32>):
    // expected-error @+1 {{is not pointwise (FusionClass Elementwise) and cannot be in a row region}}
    %t = forge.transpose %a {perm = array<i64: 0, 1>} : (tensor<2x4xf32>) -> tensor<2x4xf32>
    %s = forge.softmax %t {axis = 1 : i64} : (tensor<2x4xf32>) -> tensor<2x4xf32>
    forge.yield %s : tensor<2x4xf32>
  }
  return %r : tensor<2x4xf32>
}

// -----

func.func @row_two_results(%x: tensor<2x4xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>) {
  // expected-error @+1 {{row region must have one result}}
  %r:2 = forge.fusion "row"(%x) : (tensor<2x4xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>) {
  ^bb0(%a: tensor<2x4xf32>):
    %s = forge.softmax %a {axis = 1 : i64} : (tensor<2x4xf32>) -> tensor<2x4xf32>
    %n = forge.neg %s : (tensor<2x4xf32>) -> tensor<2x4xf32>
    forge.yield %s, %n : tensor<2x4xf32>, tensor<2x4xf32>
  }
  return %r#0, %r#1 : tensor<2x4xf32>, tensor<2x4xf32>
}

// -----

func.func @row_prologue_yielded(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  %r = forge.fusion "row"(%x) : (tensor<2x4xf32>) -> tensor<2x4xf32> {
  ^bb0(%a: tensor<2x4xf32>):
    // expected-error @+1 {{is a prologue op of a row region and cannot be yielded}}
    %e = forge.exp %a : (tensor<2x4xf32>) -> tensor<2x4xf32>
    %s = forge.softmax %e {axis = 1 : i64} : (tensor<2x4xf32>) -> tensor<2x4xf32>
    forge.yield %e : tensor<2x4xf32>
  }
  return %r : tensor<2x4xf32>
}

// -----

func.func @multi_reduce_partial_sum(%x: tensor<2x4xf32>) -> tensor<4xf32> {
  %r = forge.fusion "multi_reduce"(%x) : (tensor<2x4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<2x4xf32>):
    // expected-error @+1 {{is not a reduction of a whole tensor to a scalar}}
    %s = forge.reduce_sum %a {axes = array<i64: 0>, keepdims = false} : (tensor<2x4xf32>) -> tensor<4xf32>
    forge.yield %s : tensor<4xf32>
  }
  return %r : tensor<4xf32>
}

// -----

func.func @multi_reduce_yield_order(%x: tensor<4xf32>, %y: tensor<4xf32>) -> (tensor<f32>, tensor<f32>) {
  // expected-error @+1 {{must yield its reductions' sums in order}}
  %r:2 = forge.fusion "multi_reduce"(%x, %y) : (tensor<4xf32>, tensor<4xf32>) -> (tensor<f32>, tensor<f32>) {
  ^bb0(%a: tensor<4xf32>, %b: tensor<4xf32>):
    %s = forge.reduce_sum %a {axes = array<i64: 0>, keepdims = false} : (tensor<4xf32>) -> tensor<f32>
    %t = forge.reduce_sum %b {axes = array<i64: 0>, keepdims = false} : (tensor<4xf32>) -> tensor<f32>
    forge.yield %t, %s : tensor<f32>, tensor<f32>
  }
  return %r#0, %r#1 : tensor<f32>, tensor<f32>
}

// -----

func.func @view_region_mixed(%x: tensor<2x4xf32>) -> tensor<4x2xf32> {
  %r = forge.fusion "loop"(%x) : (tensor<2x4xf32>) -> tensor<4x2xf32> {
  ^bb0(%a: tensor<2x4xf32>):
    // expected-error @+1 {{is not a view (transpose, reshape, slice) and cannot be in a view region}}
    %e = forge.exp %a : (tensor<2x4xf32>) -> tensor<2x4xf32>
    %t = forge.transpose %e {perm = array<i64: 1, 0>} : (tensor<2x4xf32>) -> tensor<4x2xf32>
    forge.yield %t : tensor<4x2xf32>
  }
  return %r : tensor<4x2xf32>
}

// -----

// batch_norm regions: the statistics must be yielded last.
func.func @batch_norm_region_order(%x: tensor<2x4x3x3xf32>, %s: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<2x4x3x3xf32>) {
  // expected-error @+1 {{must yield values of its iteration shape, then the batch norm's running mean and variance}}
  %r:3 = forge.fusion "batch_norm"(%x, %s) : (tensor<2x4x3x3xf32>, tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<2x4x3x3xf32>) {
  ^bb0(%a: tensor<2x4x3x3xf32>, %c: tensor<4xf32>):
    %y, %m, %v = forge.batch_norm_training %a, %c, %c, %c, %c {epsilon = 1.0e-5 : f64, momentum = 0.9 : f64} : (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>)
    %e = forge.relu %y : (tensor<2x4x3x3xf32>) -> tensor<2x4x3x3xf32>
    forge.yield %m, %v, %e : tensor<4xf32>, tensor<4xf32>, tensor<2x4x3x3xf32>
  }
  return %r#0, %r#1, %r#2 : tensor<4xf32>, tensor<4xf32>, tensor<2x4x3x3xf32>
}

// -----

func.func @batch_norm_region_prologue(%x: tensor<2x4x3x3xf32>, %s: tensor<4xf32>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>) {
  %r:3 = forge.fusion "batch_norm"(%x, %s) : (tensor<2x4x3x3xf32>, tensor<4xf32>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>) {
  ^bb0(%a: tensor<2x4x3x3xf32>, %c: tensor<4xf32>):
    // expected-error @+1 {{comes before the batch norm of its batch_norm region}}
    %p = forge.relu %a : (tensor<2x4x3x3xf32>) -> tensor<2x4x3x3xf32>
    %y, %m, %v = forge.batch_norm_training %a, %c, %c, %c, %c {epsilon = 1.0e-5 : f64, momentum = 0.9 : f64} : (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>)
    forge.yield %p, %m, %v : tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>
  }
  return %r#0, %r#1, %r#2 : tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>
}

// -----

func.func @batch_norm_region_reduction(%x: tensor<2x4x3x3xf32>, %s: tensor<4xf32>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>) {
  %r:3 = forge.fusion "batch_norm"(%x, %s) : (tensor<2x4x3x3xf32>, tensor<4xf32>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>) {
  ^bb0(%a: tensor<2x4x3x3xf32>, %c: tensor<4xf32>):
    %y, %m, %v = forge.batch_norm_training %a, %c, %c, %c, %c {epsilon = 1.0e-5 : f64, momentum = 0.9 : f64} : (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>)
    // expected-error @+1 {{is not pointwise (FusionClass Elementwise) and cannot be in a batch_norm region}}
    %sm = forge.softmax %y {axis = 3 : i64} : (tensor<2x4x3x3xf32>) -> tensor<2x4x3x3xf32>
    forge.yield %sm, %m, %v : tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>
  }
  return %r#0, %r#1, %r#2 : tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>
}

// -----

func.func @batch_norm_grad_region_epilogue(%x: tensor<2x4x3x3xf32>, %s: tensor<4xf32>, %g: tensor<2x4x3x3xf32>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>) {
  %r:3 = forge.fusion "batch_norm"(%x, %s, %g) : (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<2x4x3x3xf32>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>) {
  ^bb0(%a: tensor<2x4x3x3xf32>, %c: tensor<4xf32>, %d: tensor<2x4x3x3xf32>):
    %dx, %ds, %db = forge.batch_norm_training_grad %a, %c, %d {bias_grad = true, epsilon = 1.0e-5 : f64, input_grad = true, scale_grad = true} : (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<2x4x3x3xf32>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>)
    // expected-error @+1 {{comes after the batch norm gradient of its batch_norm region}}
    %n = forge.neg %dx : (tensor<2x4x3x3xf32>) -> tensor<2x4x3x3xf32>
    forge.yield %n, %ds, %db : tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>
  }
  return %r#0, %r#1, %r#2 : tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>
}

// -----

func.func @batch_norm_region_computed_operand(%x: tensor<2x4x3x3xf32>, %s: tensor<4xf32>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>) {
  %r:3 = forge.fusion "batch_norm"(%x, %s) : (tensor<2x4x3x3xf32>, tensor<4xf32>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>) {
  ^bb0(%a: tensor<2x4x3x3xf32>, %c: tensor<4xf32>):
    %p = forge.relu %a : (tensor<2x4x3x3xf32>) -> tensor<2x4x3x3xf32>
    // expected-error @+1 {{must take the batch_norm region's arguments as operands}}
    %y, %m, %v = forge.batch_norm_training %p, %c, %c, %c, %c {epsilon = 1.0e-5 : f64, momentum = 0.9 : f64} : (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>)
    forge.yield %y, %m, %v : tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>
  }
  return %r#0, %r#1, %r#2 : tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>
}

// -----

func.func @gemm_region_product_read_twice(%x: tensor<4x8xf32>, %w: tensor<8x5xf32>) -> (tensor<4x5xf32>, tensor<4x5xf32>) {
  %r:2 = forge.fusion "gemm"(%x, %w) : (tensor<4x8xf32>, tensor<8x5xf32>) -> (tensor<4x5xf32>, tensor<4x5xf32>) {
  ^bb0(%a: tensor<4x8xf32>, %b: tensor<8x5xf32>):
    %p = forge.matmul %a, %b : (tensor<4x8xf32>, tensor<8x5xf32>) -> tensor<4x5xf32>
    // expected-error @+1 {{must alone read the product of its gemm region}}
    %y = forge.relu %p : (tensor<4x5xf32>) -> tensor<4x5xf32>
    forge.yield %y, %p : tensor<4x5xf32>, tensor<4x5xf32>
  }
  return %r#0, %r#1 : tensor<4x5xf32>, tensor<4x5xf32>
}

// -----

func.func @gemm_region_two_epilogues(%x: tensor<4x8xf32>, %w: tensor<8x5xf32>) -> tensor<4x5xf32> {
  // expected-error @+1 {{a gemm region holds one gemm, scaled_gemm or matmul and one epilogue op}}
  %r = forge.fusion "gemm"(%x, %w) : (tensor<4x8xf32>, tensor<8x5xf32>) -> tensor<4x5xf32> {
  ^bb0(%a: tensor<4x8xf32>, %b: tensor<8x5xf32>):
    %p = forge.matmul %a, %b : (tensor<4x8xf32>, tensor<8x5xf32>) -> tensor<4x5xf32>
    %y = forge.neg %p : (tensor<4x5xf32>) -> tensor<4x5xf32>
    %z = forge.neg %y : (tensor<4x5xf32>) -> tensor<4x5xf32>
    forge.yield %z : tensor<4x5xf32>
  }
  return %r : tensor<4x5xf32>
}

// -----

func.func @gemm_region_operands_out_of_order(%x: tensor<4x4xf32>, %w: tensor<4x4xf32>) -> tensor<4x4xf32> {
  %r = forge.fusion "gemm"(%x, %w) : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32> {
  ^bb0(%a: tensor<4x4xf32>, %b: tensor<4x4xf32>):
    // expected-error @+1 {{must take the gemm region's arguments, in order, as operands}}
    %p = forge.matmul %b, %a : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    %y = forge.relu %p : (tensor<4x4xf32>) -> tensor<4x4xf32>
    forge.yield %y : tensor<4x4xf32>
  }
  return %r : tensor<4x4xf32>
}

// -----

func.func @gemm_region_sum_not_over_k(%dy: tensor<6x5xf32>, %x: tensor<5x8xf32>) -> (tensor<6x8xf32>, tensor<1x5xf32>) {
  %r:2 = forge.fusion "gemm"(%dy, %x) : (tensor<6x5xf32>, tensor<5x8xf32>) -> (tensor<6x8xf32>, tensor<1x5xf32>) {
  ^bb0(%a: tensor<6x5xf32>, %b: tensor<5x8xf32>):
    %p = forge.matmul %a, %b : (tensor<6x5xf32>, tensor<5x8xf32>) -> tensor<6x8xf32>
    // expected-error @+1 {{must sum a 2-D operand of its gemm region over the contraction axis}}
    %s = forge.reduce_sum %a {axes = array<i64: 0>, keepdims = true} : (tensor<6x5xf32>) -> tensor<1x5xf32>
    forge.yield %p, %s : tensor<6x8xf32>, tensor<1x5xf32>
  }
  return %r#0, %r#1 : tensor<6x8xf32>, tensor<1x5xf32>
}

// -----

func.func @gemm_region_sum_yield_order(%dy: tensor<6x5xf32>, %x: tensor<6x8xf32>) -> (tensor<1x5xf32>, tensor<5x8xf32>) {
  // expected-error @+1 {{with a reduce_sum epilogue must yield the product, then the sum}}
  %r:2 = forge.fusion "gemm"(%dy, %x) : (tensor<6x5xf32>, tensor<6x8xf32>) -> (tensor<1x5xf32>, tensor<5x8xf32>) {
  ^bb0(%a: tensor<6x5xf32>, %b: tensor<6x8xf32>):
    %p = forge.matmul %a, %b {transA = true} : (tensor<6x5xf32>, tensor<6x8xf32>) -> tensor<5x8xf32>
    %s = forge.reduce_sum %a {axes = array<i64: 0>, keepdims = true} : (tensor<6x5xf32>) -> tensor<1x5xf32>
    forge.yield %s, %p : tensor<1x5xf32>, tensor<5x8xf32>
  }
  return %r#0, %r#1 : tensor<1x5xf32>, tensor<5x8xf32>
}

// -----

func.func @gemm_region_bias_not_a_row(%x: tensor<6x8xf32>, %w: tensor<5x8xf32>, %r: tensor<6x5xf32>, %b: tensor<6x5xf32>) -> tensor<6x5xf32> {
  %0 = forge.fusion "gemm"(%x, %w, %r, %b) : (tensor<6x8xf32>, tensor<5x8xf32>, tensor<6x5xf32>, tensor<6x5xf32>) -> tensor<6x5xf32> {
  ^bb0(%a0: tensor<6x8xf32>, %a1: tensor<5x8xf32>, %a2: tensor<6x5xf32>, %a3: tensor<6x5xf32>):
    %p = forge.gemm %a0, %a1, %a2 {alpha = 1.0 : f64, beta = 1.0 : f64, transA = false, transB = true} : (tensor<6x8xf32>, tensor<5x8xf32>, tensor<6x5xf32>) -> tensor<6x5xf32>
    // expected-error @+1 {{must add the bias row (the gemm region's last argument, of the product's columns) to the product it alone reads}}
    %s = forge.add %p, %a3 : (tensor<6x5xf32>, tensor<6x5xf32>) -> tensor<6x5xf32>
    forge.yield %s : tensor<6x5xf32>
  }
  return %0 : tensor<6x5xf32>
}

// -----

func.func @gemm_region_erf_gelu(%x: tensor<4x8xf32>, %w: tensor<8x8xf32>) -> tensor<4x8xf32> {
  %r = forge.fusion "gemm"(%x, %w) : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32> {
  ^bb0(%a: tensor<4x8xf32>, %b: tensor<8x8xf32>):
    %p = forge.matmul %a, %b : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    // expected-error @+1 {{must be the tanh GELU of its gemm region's product}}
    %g = forge.gelu %p {approximate = "none"} : (tensor<4x8xf32>) -> tensor<4x8xf32>
    forge.yield %g : tensor<4x8xf32>
  }
  return %r : tensor<4x8xf32>
}

// -----

func.func @gemm_region_gelu_aux_order(%x: tensor<4x8xf32>, %w: tensor<8x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  // expected-error @+1 {{with a GELU epilogue must yield the GELU, then optionally the product}}
  %r:2 = forge.fusion "gemm"(%x, %w) : (tensor<4x8xf32>, tensor<8x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  ^bb0(%a: tensor<4x8xf32>, %b: tensor<8x8xf32>):
    %p = forge.matmul %a, %b : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    %g = forge.gelu %p {approximate = "tanh"} : (tensor<4x8xf32>) -> tensor<4x8xf32>
    forge.yield %p, %g : tensor<4x8xf32>, tensor<4x8xf32>
  }
  return %r#0, %r#1 : tensor<4x8xf32>, tensor<4x8xf32>
}

// -----

func.func @gemm_region_gelu_grad_not_of_last_argument(%dy: tensor<4x8xf32>, %w: tensor<8x8xf32>, %h: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %r = forge.fusion "gemm"(%dy, %w, %h) : (tensor<4x8xf32>, tensor<8x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32> {
  ^bb0(%a: tensor<4x8xf32>, %b: tensor<8x8xf32>, %c: tensor<4x8xf32>):
    %p = forge.matmul %a, %b : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    // expected-error @+1 {{must be the tanh GELU's gradient of its gemm region's product, with the GELU's input as the region's last argument}}
    %d = forge.gelu_grad %p, %a {approximate = "tanh"} : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    forge.yield %d : tensor<4x8xf32>
  }
  return %r : tensor<4x8xf32>
}

// -----

func.func @gemm_region_gelu_grad_sum_over_columns(%dy: tensor<4x8xf32>, %w: tensor<8x8xf32>, %h: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x1xf32>) {
  %r:2 = forge.fusion "gemm"(%dy, %w, %h) : (tensor<4x8xf32>, tensor<8x8xf32>, tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x1xf32>) {
  ^bb0(%a: tensor<4x8xf32>, %b: tensor<8x8xf32>, %c: tensor<4x8xf32>):
    %p = forge.matmul %a, %b : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    %d = forge.gelu_grad %p, %c {approximate = "tanh"} : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    // expected-error @+1 {{must sum the GELU gradient over its rows (axis 0, keepdims)}}
    %s = forge.reduce_sum %d {axes = array<i64: 1>, keepdims = true} : (tensor<4x8xf32>) -> tensor<4x1xf32>
    forge.yield %d, %s : tensor<4x8xf32>, tensor<4x1xf32>
  }
  return %r#0, %r#1 : tensor<4x8xf32>, tensor<4x1xf32>
}

// -----

func.func @gelu_grad_shapes(%dy: tensor<4x8xf32>, %x: tensor<4x7xf32>) -> tensor<4x8xf32> {
  // expected-error @+2 {{grad_output and input must be float tensors of one type}}
  // expected-error @+1 {{failed to infer returned types}}
  %d = forge.gelu_grad %dy, %x {approximate = "tanh"} : (tensor<4x8xf32>, tensor<4x7xf32>) -> tensor<4x8xf32>
  return %d : tensor<4x8xf32>
}

// -----

func.func @gemm_region_relu_then_not_its_bitmask(%x: tensor<4x8xf32>, %w: tensor<8x5xf32>) -> (tensor<4x5xf32>, tensor<4x5xf32>) {
  %r:2 = forge.fusion "gemm"(%x, %w) : (tensor<4x8xf32>, tensor<8x5xf32>) -> (tensor<4x5xf32>, tensor<4x5xf32>) {
  ^bb0(%a: tensor<4x8xf32>, %b: tensor<8x5xf32>):
    %p = forge.matmul %a, %b : (tensor<4x8xf32>, tensor<8x5xf32>) -> tensor<4x5xf32>
    %y = forge.relu %p : (tensor<4x5xf32>) -> tensor<4x5xf32>
    // expected-error @+1 {{must be the bitmask of the gemm region's ReLU}}
    %z = forge.neg %y : (tensor<4x5xf32>) -> tensor<4x5xf32>
    forge.yield %y, %z : tensor<4x5xf32>, tensor<4x5xf32>
  }
  return %r#0, %r#1 : tensor<4x5xf32>, tensor<4x5xf32>
}

// -----

func.func @gemm_region_drelu_mask_not_last(%dy: tensor<4x8xf32>, %w: tensor<8x5xf32>, %m: tensor<4x16xi8>) -> tensor<4x5xf32> {
  %r = forge.fusion "gemm"(%m, %dy, %w) : (tensor<4x16xi8>, tensor<4x8xf32>, tensor<8x5xf32>) -> tensor<4x5xf32> {
  ^bb0(%c: tensor<4x16xi8>, %a: tensor<4x8xf32>, %b: tensor<8x5xf32>):
    // expected-error @+1 {{must take the gemm region's arguments, in order, as operands}}
    %p = forge.matmul %a, %b : (tensor<4x8xf32>, tensor<8x5xf32>) -> tensor<4x5xf32>
    %d = forge.relu_grad_bitmask %p, %c : (tensor<4x5xf32>, tensor<4x16xi8>) -> tensor<4x5xf32>
    forge.yield %d : tensor<4x5xf32>
  }
  return %r : tensor<4x5xf32>
}

// -----

func.func @relu_bitmask_row_bytes(%dy: tensor<4x130xf32>, %m: tensor<4x17xi8>) -> tensor<4x130xf32> {
  // expected-error @+2 {{mask has shape [4x17], expected [4x32]}}
  // expected-error @+1 {{failed to infer returned types}}
  %d = forge.relu_grad_bitmask %dy, %m : (tensor<4x130xf32>, tensor<4x17xi8>) -> tensor<4x130xf32>
  return %d : tensor<4x130xf32>
}

// -----

func.func @scaled_gemm_not_float8(%a: tensor<8x32xbf16>, %b: tensor<16x32xbf16>, %s: tensor<f32>) -> tensor<8x16xf32> {
  // expected-error @+1 {{takes float8 (f8E4M3FN or f8E5M2) operands}}
  %0 = forge.scaled_gemm %a, %b, %s, %s {alpha = 1.0 : f64, beta = 0.0 : f64, transA = false, transB = true} : (tensor<8x32xbf16>, tensor<16x32xbf16>, tensor<f32>, tensor<f32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

func.func @scaled_gemm_scale_not_scalar(%a: tensor<8x32xf8E4M3FN>, %b: tensor<16x32xf8E4M3FN>, %s: tensor<1xf32>) -> tensor<8x16xf32> {
  // expected-error @+1 {{takes f32 scalar scales}}
  %0 = forge.scaled_gemm %a, %b, %s, %s {alpha = 1.0 : f64, beta = 0.0 : f64, transA = false, transB = true} : (tensor<8x32xf8E4M3FN>, tensor<16x32xf8E4M3FN>, tensor<1xf32>, tensor<1xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

// forge.shard (tensor parallelism) splits an initializer into equal parts.
func.func @bad_shard(%x: tensor<6xf32>) -> tensor<3xf32> {
  // expected-error @+1 {{must split an initializer}}
  %s = forge.shard %x {axis = 0 : i64, group = "tp", size = 2 : i64} : (tensor<6xf32>) -> tensor<3xf32>
  return %s : tensor<3xf32>
}

// -----

func.func @bad_parts() -> tensor<2xf32> {
  %w = forge.constant {forge.initializer = "w"} dense<1.0> : tensor<6xf32>
  // expected-error @+1 {{result 'tensor<2xf32>' is not part 1/2 of 'tensor<6xf32>' along axis 0}}
  %s = forge.shard %w {axis = 0 : i64, group = "tp", size = 2 : i64} : (tensor<6xf32>) -> tensor<2xf32>
  return %s : tensor<2xf32>
}

// -----

func.func @all_reduce_reduction(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{reduction 'min' is not 'sum', 'mean' or 'max'}}
  %r = forge.all_reduce %x {group = "tp", reduction = "min", size = 2 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

func.func @reduce_scatter_parts(%x: tensor<5x3xf32>) -> tensor<2x3xf32> {
  // expected-error @+1 {{has no dim 0 that splits into 2 equal parts}}
  %r = forge.reduce_scatter %x {group = "dp", reduction = "mean", size = 2 : i64} : (tensor<5x3xf32>) -> tensor<2x3xf32>
  return %r : tensor<2x3xf32>
}

// -----

func.func @all_gather_parts(%x: tensor<2x3xf32>) -> tensor<4x4xf32> {
  // expected-error @+1 {{'tensor<2x3xf32>' is not part 1/2 of 'tensor<4x4xf32>' along dim 0}}
  %r = forge.all_gather %x {group = "dp", size = 2 : i64} : (tensor<2x3xf32>) -> tensor<4x4xf32>
  return %r : tensor<4x4xf32>
}

// -----

// Pipeline messages: a peer inside the group, a group of two or more, order
// tokens of type tensor<0xi1>.
func.func @send_peer_outside(%x: tensor<4xf32>) -> tensor<0xi1> {
  // expected-error @+1 {{peer 2 is outside the group of 2}}
  %t = forge.send %x {group = "pp", peer = 2 : i64, tag = 0 : i64, size = 2 : i64} : (tensor<4xf32>) -> tensor<0xi1>
  return %t : tensor<0xi1>
}

// -----

func.func @recv_group_of_one() -> tensor<4xf32> {
  // expected-error @+1 {{group size 1 is below 2}}
  %r, %t = forge.recv {group = "pp", peer = 0 : i64, tag = 0 : i64, size = 1 : i64} : () -> (tensor<4xf32>, tensor<0xi1>)
  return %r : tensor<4xf32>
}

// -----

func.func @send_bad_token(%x: tensor<4xf32>, %after: tensor<1xi1>) -> tensor<0xi1> {
  // expected-error @+1 {{'after' must be an order token, tensor<0xi1>, got 'tensor<1xi1>'}}
  %t = forge.send %x, %after {group = "pp", peer = 1 : i64, tag = 0 : i64, size = 2 : i64} : (tensor<4xf32>, tensor<1xi1>) -> tensor<0xi1>
  return %t : tensor<0xi1>
}

// -----

func.func @recv_negative_tag() -> tensor<4xf32> {
  // expected-error @+1 {{tag -1 is negative}}
  %r, %t = forge.recv {group = "pp", peer = 1 : i64, tag = -1 : i64, size = 2 : i64} : () -> (tensor<4xf32>, tensor<0xi1>)
  return %r : tensor<4xf32>
}

// -----

func.func @resized_crop_geometry(%c: tensor<2x8x9x3xui8>, %g: tensor<2x4xf32>) -> tensor<2x4x5x3xf32> {
  // expected-error @+2 {{resized_crop takes a canvas [B, Hc, Wc, C] and a geometry [B, 6]}}
  // expected-error @+1 {{failed to infer returned types}}
  %y = forge.resized_crop %c, %g {height = 4 : i64, width = 5 : i64} : (tensor<2x8x9x3xui8>, tensor<2x4xf32>) -> tensor<2x4x5x3xf32>
  return %y : tensor<2x4x5x3xf32>
}

// -----

func.func @resized_crop_size(%c: tensor<2x8x9x3xui8>, %g: tensor<2x6xf32>) -> tensor<2x4x5x3xf32> {
  // expected-error @+2 {{resized_crop's height and width must be positive}}
  // expected-error @+1 {{failed to infer returned types}}
  %y = forge.resized_crop %c, %g {height = 0 : i64, width = 5 : i64} : (tensor<2x8x9x3xui8>, tensor<2x6xf32>) -> tensor<2x4x5x3xf32>
  return %y : tensor<2x4x5x3xf32>
}

// -----

// A lines region starts with its reduction of its argument over one axis that is not the last.
func.func @lines_row(%x: tensor<2x8x32xf32>) -> tensor<2x8x32xf32> {
  // expected-error @+1 {{lines region must start with a keepdims reduce_sum or reduce_mean of its input over one axis that is not the last}}
  %r = forge.fusion "lines"(%x) : (tensor<2x8x32xf32>) -> tensor<2x8x32xf32> {
  ^bb0(%a: tensor<2x8x32xf32>):
    %m = forge.reduce_mean %a {axes = array<i64: 2>, keepdims = true} : (tensor<2x8x32xf32>) -> tensor<2x8x1xf32>
    %0 = forge.sub %a, %m : (tensor<2x8x32xf32>, tensor<2x8x1xf32>) -> tensor<2x8x32xf32>
    forge.yield %0 : tensor<2x8x32xf32>
  }
  return %r : tensor<2x8x32xf32>
}

// -----

func.func @lines_two_inputs(%x: tensor<2x8x32xf32>, %y: tensor<2x8x32xf32>) -> tensor<2x8x32xf32> {
  // expected-error @+1 {{lines region must have one input and one result at its iteration shape}}
  %r = forge.fusion "lines"(%x, %y) : (tensor<2x8x32xf32>, tensor<2x8x32xf32>) -> tensor<2x8x32xf32> {
  ^bb0(%a: tensor<2x8x32xf32>, %b: tensor<2x8x32xf32>):
    %m = forge.reduce_mean %a {axes = array<i64: 1>, keepdims = true} : (tensor<2x8x32xf32>) -> tensor<2x1x32xf32>
    %0 = forge.sub %b, %m : (tensor<2x8x32xf32>, tensor<2x1x32xf32>) -> tensor<2x8x32xf32>
    forge.yield %0 : tensor<2x8x32xf32>
  }
  return %r : tensor<2x8x32xf32>
}

// -----

func.func @lines_second_reduction(%x: tensor<2x8x32xf32>) -> tensor<2x8x32xf32> {
  %r = forge.fusion "lines"(%x) : (tensor<2x8x32xf32>) -> tensor<2x8x32xf32> {
  ^bb0(%a: tensor<2x8x32xf32>):
    %m = forge.reduce_mean %a {axes = array<i64: 1>, keepdims = true} : (tensor<2x8x32xf32>) -> tensor<2x1x32xf32>
    // expected-error @+1 {{is not pointwise at the lines region's iteration shape}}
    %s = forge.reduce_sum %a {axes = array<i64: 0>, keepdims = true} : (tensor<2x8x32xf32>) -> tensor<1x8x32xf32>
    %0 = forge.sub %a, %m : (tensor<2x8x32xf32>, tensor<2x1x32xf32>) -> tensor<2x8x32xf32>
    %1 = forge.add %0, %s : (tensor<2x8x32xf32>, tensor<1x8x32xf32>) -> tensor<2x8x32xf32>
    forge.yield %1 : tensor<2x8x32xf32>
  }
  return %r : tensor<2x8x32xf32>
}

// -----

// linear_cross_entropy_with_grad: w's columns must be x's, and classes in 1..C (a negative
// classes reads as a huge unsigned value in the adaptor: still refused).
func.func @linear_ce_k(%x: tensor<4x8xbf16>, %w: tensor<16x4xbf16>, %t: tensor<4xi64>, %g: tensor<f32>) {
  // expected-error @+2 {{linear_cross_entropy_with_grad: w's columns are not x's}}
  // expected-error @+1 {{failed to infer returned types}}
  %l, %d = forge.linear_cross_entropy_with_grad %x, %w, %t, %g {reduction = "sum"} : (tensor<4x8xbf16>, tensor<16x4xbf16>, tensor<4xi64>, tensor<f32>) -> (tensor<4xf32>, tensor<4x16xbf16>)
  return
}

// -----

func.func @linear_ce_classes(%x: tensor<4x8xbf16>, %w: tensor<16x8xbf16>, %t: tensor<4xi64>, %g: tensor<f32>) {
  // expected-error @+2 {{linear_cross_entropy_with_grad: classes is outside 1..C}}
  // expected-error @+1 {{failed to infer returned types}}
  %l, %d = forge.linear_cross_entropy_with_grad %x, %w, %t, %g {classes = -3 : i64, reduction = "sum"} : (tensor<4x8xbf16>, tensor<16x8xbf16>, tensor<4xi64>, tensor<f32>) -> (tensor<4xf32>, tensor<4x16xbf16>)
  return
}

// -----

func.func @linear_ce_wide(%x: tensor<4x8xbf16>, %w: tensor<16x8xbf16>, %t: tensor<4xi64>, %g: tensor<f32>) {
  // expected-error @+2 {{linear_cross_entropy_with_grad: classes is outside 1..C}}
  // expected-error @+1 {{failed to infer returned types}}
  %l, %d = forge.linear_cross_entropy_with_grad %x, %w, %t, %g {classes = 17 : i64, reduction = "sum"} : (tensor<4x8xbf16>, tensor<16x8xbf16>, tensor<4xi64>, tensor<f32>) -> (tensor<4xf32>, tensor<4x16xbf16>)
  return
}

// -----

func.func @zero_outputs_past_the_result(%x: tensor<4x6xf32>) {
  // expected-error @+2 {{zero_outputs must be [begin, end) with 0 <= begin < end <= 6 (the result's elements)}}
  // expected-error @+1 {{failed to infer returned types}}
  %s = forge.reduce_sum %x {axes = array<i64: 0>, keepdims = false, zero_outputs = array<i64: 2, 7>} : (tensor<4x6xf32>) -> tensor<6xf32>
  return
}

// -----

func.func @zero_outputs_empty(%x: tensor<4x6xf32>) {
  // expected-error @+2 {{zero_outputs must be [begin, end)}}
  // expected-error @+1 {{failed to infer returned types}}
  %s = forge.reduce_sum %x {axes = array<i64: 0>, keepdims = false, zero_outputs = array<i64: 3, 3>} : (tensor<4x6xf32>) -> tensor<6xf32>
  return
}

// -----

// A layer norm's grad_output may be stored in another float type
// (forge-assign-precision's low-norm-gradients), but has x's shape.
func.func @layer_norm_grad_dy_shape(%x: tensor<4x8xf32>, %s: tensor<8xf32>, %dy: tensor<4x4xbf16>) {
  // expected-error @+2 {{grad_output must have the input's shape, both floats}}
  // expected-error @+1 {{failed to infer returned types}}
  %g:3 = forge.layer_norm_grad %x, %s, %dy {axis = 1 : i64, bias_grad = true, epsilon = 1.0e-5 : f64, input_grad = true, scale_grad = true} : (tensor<4x8xf32>, tensor<8xf32>, tensor<4x4xbf16>) -> (tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>)
  return
}

// -----

func.func @layer_norm_grad_dy_integer(%x: tensor<4x8xf32>, %s: tensor<8xf32>, %dy: tensor<4x8xi32>) {
  // expected-error @+2 {{grad_output must have the input's shape, both floats}}
  // expected-error @+1 {{failed to infer returned types}}
  %g:3 = forge.layer_norm_grad %x, %s, %dy {axis = 1 : i64, bias_grad = true, epsilon = 1.0e-5 : f64, input_grad = true, scale_grad = true} : (tensor<4x8xf32>, tensor<8xf32>, tensor<4x8xi32>) -> (tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>)
  return
}

// -----

// Other norms' gradients keep grad_output in x's type.
func.func @batch_norm_grad_dy_low(%x: tensor<2x4x3x3xf32>, %s: tensor<4xf32>, %dy: tensor<2x4x3x3xbf16>) {
  // expected-error @+2 {{grad_output must have the input's type}}
  // expected-error @+1 {{failed to infer returned types}}
  %dx, %ds, %db = forge.batch_norm_training_grad %x, %s, %dy {bias_grad = true, epsilon = 1.0e-5 : f64, input_grad = true, scale_grad = true} : (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<2x4x3x3xbf16>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>)
  return
}
