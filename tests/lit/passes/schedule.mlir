// RUN: forge-opt %s --split-input-file --forge-schedule | FileCheck %s
// RUN: forge-opt %s --split-input-file --forge-schedule=report=true -o /dev/null | FileCheck %s --check-prefix=REPORT
// RUN: forge-opt %s --split-input-file --forge-schedule=order=program | FileCheck %s --check-prefix=PROGRAM
// RUN: not forge-opt %s --split-input-file --forge-schedule --forge-schedule 2>&1 | FileCheck %s --check-prefix=TWICE
// RUN: not forge-opt %s --split-input-file --forge-schedule=order=random 2>&1 | FileCheck %s --check-prefix=BADORDER
// RUN: forge-opt %s --split-input-file --forge-schedule="order=program compute-streams=2" | FileCheck %s --check-prefix=STREAMS
// RUN: forge-opt %s --split-input-file --forge-schedule="order=program compute-streams=2 report=true" -o /dev/null | FileCheck %s --check-prefix=STREAMS-REPORT
// RUN: forge-opt %s --split-input-file --forge-schedule="order=program compute-streams=2" --forge-plan-memory | FileCheck %s --check-prefix=STREAMS-PLAN
// RUN: forge-opt %s --split-input-file --forge-schedule="order=program compute-streams=2 report=true" -o /dev/null | FileCheck %s --check-prefix=NOPIN
// RUN: forge-opt %s --split-input-file --forge-schedule="order=program compute-streams=2 max-stream-pins=64" | FileCheck %s --check-prefix=PINS
// RUN: forge-opt %s --split-input-file --forge-schedule="order=program compute-streams=2 max-stream-pins=64 report=true" -o /dev/null | FileCheck %s --check-prefix=PINS-REPORT
// RUN: not forge-opt %s --split-input-file --forge-schedule=compute-streams=0 2>&1 | FileCheck %s --check-prefix=BADSTREAMS
// RUN: not forge-opt %s --split-input-file --forge-schedule=max-stream-pins=-1 2>&1 | FileCheck %s --check-prefix=BADPINS
// BADPINS: error: forge-schedule: max-stream-pins must be 0 or more, not -1
// BADSTREAMS: error: forge-schedule: compute-streams must be 1 to 16, not 0
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

// -----

// Further compute streams (compute-streams=2): %c reads only an argument, so
// it forks onto compute.1 (idle the longest) and runs beside the chain; %e
// continues %d's stream and waits for %c's event. The estimated peak stays.
// STREAMS-LABEL: func @fork
// STREAMS-SAME: forge.events = 1 : i64, forge.joins = array<i64>, forge.streams = ["compute", "compute.1"]
// STREAMS: forge.exp %arg0 :
// STREAMS-NEXT: forge.abs
// STREAMS-NEXT: forge.neg %arg0 {forge.event = 1 : i64, forge.stream = 1 : i64}
// STREAMS-NEXT: forge.sqrt
// STREAMS-NEXT: forge.mul {{.*}}{forge.waits = array<i64: 1>}
// STREAMS-REPORT: schedule of @fork: 5 ops on 2 streams (compute, compute.1), 1 event; order program; 1 ops on further compute streams (estimated peak 768.0 B)
// STREAMS-REPORT: 2 neg -> e1
// STREAMS-REPORT: 4 mul (waits e1)
func.func @fork(%x: tensor<64xf32> {forge.kind = "input", forge.name = "x"})
    -> (tensor<64xf32> {forge.name = "y"}) {
  %a = forge.exp %x : (tensor<64xf32>) -> tensor<64xf32>
  %b = forge.abs %a : (tensor<64xf32>) -> tensor<64xf32>
  %c = forge.neg %x : (tensor<64xf32>) -> tensor<64xf32>
  %d = forge.sqrt %b : (tensor<64xf32>) -> tensor<64xf32>
  %e = forge.mul %d, %c : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
  return %e : tensor<64xf32>
}

// -----

// %c forks off %a, which a side stream's read would keep live until the
// compute stream waits for it: the peak would grow, so one compute stream.
// STREAMS-LABEL: func @refused
// STREAMS-SAME: forge.streams = ["compute"]
// STREAMS-NOT: forge.stream =
// STREAMS: return
// STREAMS-REPORT: schedule of @refused: {{.*}}; one compute stream (further ones would raise the estimated peak to 1.0 KiB)
func.func @refused(%x: tensor<64xf32> {forge.kind = "input", forge.name = "x"})
    -> (tensor<64xf32> {forge.name = "y"}) {
  %a = forge.exp %x : (tensor<64xf32>) -> tensor<64xf32>
  %b = forge.abs %a : (tensor<64xf32>) -> tensor<64xf32>
  %c = forge.neg %a : (tensor<64xf32>) -> tensor<64xf32>
  %d = forge.sqrt %b : (tensor<64xf32>) -> tensor<64xf32>
  %e = forge.mul %d, %c : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
  return %e : tensor<64xf32>
}

// -----

// Three side ops would raise the peak too far; the one holding the most bytes
// across it (%g: %f's 4 KiB and its own) goes back to the compute stream,
// after which the peak fits and %f and %c stay beside (max-stream-pins=64).
// By default (0) the old rule: all side ops or one stream.
// PINS-LABEL: func @pinned
// PINS: forge.neg %arg1 {forge.stream = 1 : i64}
// PINS: forge.neg %{{.*}}forge.stream = 1 : i64
// PINS: forge.abs %1 :
// PINS-REPORT: schedule of @pinned: {{.*}}; 2 ops on further compute streams (estimated peak 8.2 KiB, 1 kept in order for it)
// PINS-REPORT: 6 abs
// NOPIN: schedule of @pinned: {{.*}}; one compute stream (further ones would raise the estimated peak to 9.0 KiB)
// STREAMS-LABEL: func @pinned
// STREAMS-SAME: forge.streams = ["compute"]
func.func @pinned(%x: tensor<64xf32> {forge.kind = "input", forge.name = "x"},
                  %w: tensor<1024xf32> {forge.kind = "input", forge.name = "w"})
    -> (tensor<64xf32> {forge.name = "y"}, tensor<1024xf32> {forge.name = "z"}) {
  %a = forge.exp %x : (tensor<64xf32>) -> tensor<64xf32>
  %f = forge.neg %w : (tensor<1024xf32>) -> tensor<1024xf32>
  %b = forge.abs %a : (tensor<64xf32>) -> tensor<64xf32>
  %c = forge.neg %a : (tensor<64xf32>) -> tensor<64xf32>
  %d = forge.sqrt %b : (tensor<64xf32>) -> tensor<64xf32>
  %e = forge.mul %d, %c : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
  %g = forge.abs %f : (tensor<1024xf32>) -> tensor<1024xf32>
  return %e, %g : tensor<64xf32>, tensor<1024xf32>
}

// -----

// A parameter read on compute.1 and updated in place on the compute stream:
// the update waits for the read (the edge forge-plan-memory adds: data flow
// alone would let it overwrite w under the read).
// STREAMS-PLAN-LABEL: func @overwrite
// STREAMS-PLAN: forge.exp %arg0
// STREAMS-PLAN-NEXT: forge.neg %arg1 {forge.event = 1 : i64, forge.offsets = array<i64: {{[0-9]+}}>, forge.stream = 1 : i64}
// STREAMS-PLAN-NEXT: forge.sub %arg1, %{{.*}} {forge.offsets = array<i64: -1>, forge.waits = array<i64: 1>}
func.func @overwrite(%x: tensor<64xf32> {forge.kind = "input", forge.name = "x"},
                     %w: tensor<64xf32> {forge.kind = "parameter", forge.name = "w"})
    -> (tensor<64xf32> {forge.name = "y"}, tensor<64xf32> {forge.updates = "w"}) {
  %a = forge.exp %x : (tensor<64xf32>) -> tensor<64xf32>
  %r = forge.neg %w : (tensor<64xf32>) -> tensor<64xf32>
  %w2 = forge.sub %w, %a : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
  return %r, %w2 : tensor<64xf32>, tensor<64xf32>
}
