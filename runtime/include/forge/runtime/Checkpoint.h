// Training checkpoints (../shared/DESIGN.md §7): every PARAMETER and STATE tensor by
// name, the step, the data-loader position, the shuffling seed, the bundle's
// source hash and a fingerprint of its persistent tensors.
//
// File: an uncompressed .npz (readable with numpy.load) with members
//   forge_checkpoint   uint8 JSON: format, version, step, epoch, index, seed,
//                      shuffle, train_samples, samples_per_step, source_hash,
//                      fingerprint, tensors [{name, kind, dtype, shape, crc32}]
//   param/NAME, state/NAME   the tensor values (bf16/f8 as raw uint16/uint8)
//
// Sharded (several ranks, forge-train --ckpt-format sharded, the default with
// more than one rank): a directory ckpt-<step>.forgeckpt/ of one such file per
// rank, rank-<r>-of-<n>.forgeckpt (version 2; metadata "shard": {rank, ranks}),
// each holding the pieces that rank writes (checkpointPieces: every piece of
// the world once); a split tensor's entry has "part": {axis, index, parts,
// blocks} and the piece's shape. Reading joins the pieces into whole tensors,
// so a sharded checkpoint resumes on any layout, as a whole file does.
//
// Invariants:
//  * Writes are atomic: temporary file, fsync, rename, directory fsync. A
//    checkpoint file is never overwritten or deleted by Forge; CheckpointDir
//    picks a fresh name when ckpt-<step>.forgeckpt exists already.
//  * Loading checks everything before touching the executor: the zip CRC of
//    every member, each tensor's own CRC32 from the metadata, the source hash
//    and the fingerprint (names, kinds, dtypes, shapes). A checkpoint that fails
//    any check leaves the executor unchanged.
//  * The shuffling order is a pure function of (seed, epoch) (EpochSampler),
//    so (seed, epoch, index) is the complete RNG and data-loader state.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "forge/runtime/Executor.h"
#include "forge/runtime/Shards.h"
#include "forge/runtime/Status.h"

namespace forge::rt {

class Communicator;

/// The newest format written: 2 (a sharded checkpoint's rank files; whole
/// files are still written as version 1).
inline constexpr int kCheckpointVersion = 2;

struct CheckpointState {
  int64_t step = 0;   // optimizer steps completed
  uint64_t epoch = 0; // data-loader position: epoch ...
  int64_t index = 0;  // ... and next index into its permutation
  uint64_t seed = 0;  // shuffling seed
  bool shuffle = true;
  int64_t trainSamples = 0;   // samples in the training data
  int64_t samplesPerStep = 0; // micro-batches x batch
  /// Set by readCheckpoint (not stored): the training options (optimizer,
  /// loss, schedule, ...) the checkpoint's bundle had that the current one
  /// changes, as "name: checkpoint 'a', bundle 'b'".
  std::vector<std::string> changedOptions;
};

/// What went wrong when a checkpoint was refused.
enum class CheckpointError {
  None,
  Io,       // cannot open or read
  Corrupt,  // truncated, CRC mismatch, malformed
  Mismatch, // a valid checkpoint of another bundle (or a newer format)
};

/// Whether `t` is an accumulation loop's gradient accumulator (role
/// "grad_accumulator", forgec --accumulate loop): scratch between steps that
/// each step's first micro-batch overwrites, so checkpoints (every form of
/// them) and --dump-params leave it out, as they leave out the parameters'
/// low-precision copies (Executor::isDerivedCopy).
bool isGradAccumulator(const bundle::TensorInfo &t);

/// Hex fingerprint of the bundle's persistent tensors (name, kind, dtype,
/// shape of every PARAMETER and STATE tensor, in table order).
std::string persistentFingerprint(const bundle::Program &program);

/// Writes `ex`'s persistent tensors and `state` to `path` (atomically).
/// `whole`: the split tensors (forgec --tp) made whole by gatherShards; a
/// checkpoint holds whole tensors, so it resumes on another layout.
Status writeCheckpoint(const std::string &path, const Executor &ex,
                       const CheckpointState &state, const WholeTensors *whole = nullptr);

/// Writes this rank's file of a sharded checkpoint to `path` (atomically): the
/// pieces of checkpointPieces(ex), as this rank holds them.
Status writeCheckpointShard(const std::string &path, const Executor &ex,
                            const CheckpointState &state, int64_t rank, int64_t ranks);

/// Validates `path` (a checkpoint file, or a sharded checkpoint's directory:
/// every rank's file present and of one checkpoint) against `ex`'s bundle
/// and restores every persistent tensor (this rank's slice of a split one).
/// On error `ex` is unchanged and `*error` (if given) says why.
Expected<CheckpointState> readCheckpoint(const std::string &path, Executor &ex,
                                         CheckpointError *error = nullptr);

/// A directory of checkpoints: ckpt-<step>.forgeckpt (ckpt-<step>.<n>.forgeckpt
/// when the plain name is taken) and `latest`, a one-line file naming the
/// newest one.
class CheckpointDir {
public:
  explicit CheckpointDir(std::string dir) : dir_(std::move(dir)) {}
  const std::string &path() const { return dir_; }

  /// Creates the directory (and its parents) if needed.
  Status create() const;
  /// Before training: creates the directory, checks that a file can be
  /// written in it (not at the first checkpoint, hours later), and removes the
  /// temporary files a killed writer left (`*.forgeckpt.tmp.*`, `latest.tmp.*`),
  /// reporting each through `warn`.
  Status prepare(const std::function<void(const std::string &)> &warn) const;
  /// Writes a checkpoint for state.step under a fresh name, then points
  /// `latest` at it. Returns the file's path.
  Expected<std::string> save(const Executor &ex, const CheckpointState &state,
                             const WholeTensors *whole = nullptr) const;
  /// A sharded checkpoint for state.step, written by every rank of `world`
  /// together (a collective: all call it at the same step): rank 0 picks the
  /// fresh name and makes the directory, each rank writes its file, and once
  /// all succeeded rank 0 points `latest` at it. A rank that fails fails every
  /// rank's call, and `latest` stays. Returns the directory's path.
  Expected<std::string> saveSharded(const Executor &ex, const CheckpointState &state,
                                    Communicator &world) const;
  /// Checkpoints (files or sharded directories), newest (highest step, then
  /// suffix) first.
  std::vector<std::string> list() const;
  /// Restores the newest valid checkpoint (highest step; `latest` is only a
  /// hint for other tools, a newer valid file wins). Corrupt or unreadable
  /// files are skipped (each reported through `warn`) and left in place; a
  /// checkpoint of another bundle is an error; changed training options are
  /// reported through `warn`. nullopt when the directory holds none; an error
  /// when it holds some but none is valid.
  Expected<std::optional<CheckpointState>>
  resume(Executor &ex, const std::function<void(const std::string &)> &warn) const;

private:
  std::string dir_;
};

} // namespace forge::rt
