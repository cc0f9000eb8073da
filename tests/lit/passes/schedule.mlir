// RUN: forge-opt %s --split-input-file --forge-schedule | FileCheck %s
// RUN: forge-opt %s --split-input-file --forge-schedule=report=true -o /dev/null | FileCheck %s --check-prefix=REPORT
// RUN: forge-opt %s --split-input-file --forge-schedule=order=program | FileCheck %s --check-prefix=PROGRAM
// RUN: not forge-opt %s --split-input-file --forge-schedule --forge-schedule 2>&1 | FileCheck %s --check-prefix=TWICE
// RUN: not forge-opt %s --split-input-file --forge-schedule=order=random 2>&1 | FileCheck %s --check-prefix=BADORDER
// TWICE: error: the routine is already scheduled
// BADORDER: error: forge-schedule: order must be memory or program, not 'random'

// A value made at the start and first read at the end (a weight's cast) is
// made where it is read: its operand is an argument, so nothing lives longer.
// CHECK-LABEL: func @sink
// CHECK-SAME: forge.events = 0 : i64, forge.joins = array<i64>, forge.streams = ["compute"]
// CHECK: forge.exp %arg0
// CHECK-NEXT: forge.abs
// CHECK-NEXT: forge.neg %arg1
// CHECK-NEXT: forge.mul
// PROGRAM-LABEL: func @sink
// PROGRAM: forge.neg %arg1
// PROGRAM-NEXT: forge.exp %arg0
// REPORT: schedule of @sink: 4 ops on 1 stream (compute), 0 events; order memory (ops moved to their first readers: 1; estimated peak 768.0 B -> 768.0 B)
// REPORT-NEXT: #  compute
// REPORT-NEXT: 0  exp
// REPORT-NEXT: 1  abs
// REPORT-NEXT: 2  neg
// REPORT-NEXT: 3  mul
func.func @sink(%x: tensor<64xf32> {forge.kind = "input", forge.name = "x"},
                %w: tensor<64xf32> {forge.kind = "parameter", forge.name = "w"})
    -> (tensor<64xf32> {forge.name = "y"}) {
  %c = forge.neg %w : (tensor<64xf32>) -> tensor<64xf32>
  %a = forge.exp %x : (tensor<64xf32>) -> tensor<64xf32>
  %b = forge.abs %a : (tensor<64xf32>) -> tensor<64xf32>
  %y = forge.mul %b, %c : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
  return %y : tensor<64xf32>
}

// -----

// Moving %c to its reader would keep %t live longer (%t's last other reader
// comes before): nothing moves.
// CHECK-LABEL: func @operand_would_live_longer
// CHECK: forge.exp
// CHECK-NEXT: forge.neg
// CHECK-NEXT: forge.abs
// CHECK-NEXT: forge.sqrt
// CHECK-NEXT: forge.mul
// REPORT: schedule of @operand_would_live_longer: 5 ops on 1 stream (compute), 0 events; order memory (ops moved to their first readers: 0;
func.func @operand_would_live_longer(%x: tensor<64xf32> {forge.kind = "input", forge.name = "x"})
    -> (tensor<64xf32> {forge.name = "y"}) {
  %t = forge.exp %x : (tensor<64xf32>) -> tensor<64xf32>
  %c = forge.neg %t : (tensor<64xf32>) -> tensor<64xf32>
  %u = forge.abs %t : (tensor<64xf32>) -> tensor<64xf32>
  %v = forge.sqrt %u : (tensor<64xf32>) -> tensor<64xf32>
  %y = forge.mul %v, %c : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
  return %y : tensor<64xf32>
}

// -----

// Collectives run on the collective stream and never move. Each waits for
// the event after its operand's producer; the first compute reader of its
// result waits for its event; the second collective's result is only
// returned, so the end joins it. %a is read by compute and collective ops:
// one event, one wait.
// CHECK-LABEL: func @streams
// CHECK-SAME: forge.events = 4 : i64, forge.joins = array<i64: 4>, forge.streams = ["compute", "collective"]
// CHECK: forge.neg %arg0 {forge.event = 1 : i64}
// CHECK-NEXT: forge.all_reduce {{.*}}{forge.event = 2 : i64, forge.stream = 1 : i64, forge.waits = array<i64: 1>
// CHECK-NEXT: forge.abs %arg0 {forge.event = 3 : i64}
// CHECK-NEXT: forge.mul {{.*}}{forge.waits = array<i64: 2>}
// CHECK-NEXT: forge.all_reduce {{.*}}{forge.event = 4 : i64, forge.stream = 1 : i64, forge.waits = array<i64: 3>
// REPORT: schedule of @streams: 5 ops on 2 streams (compute, collective), 4 events
// REPORT: 1 all_reduce (waits e1) -> e2
// REPORT: 3  mul (waits e2)
// REPORT: end  compute waits e4
func.func @streams(%x: tensor<16xf32> {forge.kind = "input", forge.name = "x"})
    -> (tensor<16xf32> {forge.name = "y"}, tensor<16xf32> {forge.name = "s"}) {
  %g = forge.neg %x : (tensor<16xf32>) -> tensor<16xf32>
  %r = forge.all_reduce %g {group = "dp", reduction = "mean", size = 2 : i64} : (tensor<16xf32>) -> tensor<16xf32>
  %a = forge.abs %x : (tensor<16xf32>) -> tensor<16xf32>
  %y = forge.mul %r, %a : (tensor<16xf32>, tensor<16xf32>) -> tensor<16xf32>
  %s = forge.all_reduce %a {group = "dp", reduction = "sum", size = 2 : i64} : (tensor<16xf32>) -> tensor<16xf32>
  return %y, %s : tensor<16xf32>, tensor<16xf32>
}
