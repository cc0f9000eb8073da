// Training data: where samples come from (DataSource) and in which order they
// are visited (EpochSampler). ../shared/DESIGN.md §7 "Input pipeline".
//
// Invariants:
//  * A DataSource is bound once to the fields the bundle needs (name, dtype,
//    per-sample shape); bind() checks every array against its field and fails
//    with an error naming the file, the array, and what was expected. After a
//    successful bind(), fill() only copies bytes (and checks label ranges of
//    lazily read token shards), so a training step cannot fail on data that
//    bind() accepted, except for an out-of-range token.
//  * Samples are indexed 0..numSamples()-1; fill() writes the samples of
//    `indices`, in that order, into one caller-owned buffer per bound field
//    ([indices.size(), ...sampleShape] of the field's dtype).
//  * No implicit dtype conversion for .npy/.npz arrays: the dtype must equal
//    the bundle's. Token shards (.bin) are integer ids by definition and are
//    widened to the input's integer dtype.
//  * The EpochSampler's order is a pure function of (seed, epoch): a
//    checkpoint needs only its Position to reproduce the rest of the run.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "forge/runtime/Npy.h"
#include "forge/runtime/Status.h"
#include "forge/runtime/Tensor.h"

namespace forge::rt {

/// One array a training or eval step needs per sample.
struct DataField {
  std::string name;
  DType dtype = bundle::DTYPE_UNSPECIFIED;
  std::vector<int64_t> sampleShape; // the bundle input's shape without dim 0
  /// Class labels: values must lie in [0, numClasses) (0: unchecked), except
  /// `ignoreValue` when set.
  int64_t numClasses = 0;
  std::optional<int64_t> ignoreValue;
  /// The loss's label input (token shards feed it the next tokens).
  bool isLabel = false;
};

class DataSource {
public:
  virtual ~DataSource() = default;
  /// Checks the data against `fields` and remembers them (fill order).
  virtual Status bind(const std::vector<DataField> &fields) = 0;
  /// Number of samples (valid after bind()).
  virtual int64_t numSamples() const = 0;
  /// Writes samples `indices` into outs[i] for the i-th bound field.
  virtual Status fill(std::span<const int64_t> indices, std::span<void *const> outs) = 0;
  /// Whether fill() may run on several threads at once, each with its own
  /// indices and buffers (data workers split a batch that way).
  virtual bool concurrentFill() const { return false; }
  /// GPU image decoding (Executor::bindEncodedInput), after bind(): from now on fill() takes
  /// one more buffer after the fields' (a u32 per sample) and puts each baseline JPEG whose
  /// full size fits the canvas as its bytes at the start of its slot of the image field,
  /// its length in that buffer (0: decoded here, pixels as before); its crop box is for the
  /// full-size image. Returns the image field's index, or why this source cannot.
  virtual Expected<int> encodeImages() {
    return Status::error("{}: only image folders of a canvas bundle (forgec --augment "
                         "pixels,canvas=HxW) decode on the device",
                         describe());
  }
  /// The epoch of the samples the next fill() calls take (random augmentation is a
  /// pure function of seed, epoch and sample index; the trainer sets it per step).
  virtual void setEpoch(uint64_t epoch) { (void)epoch; }
  /// The file(s) behind this source, for messages.
  virtual std::string describe() const = 0;
  /// Arrays the last bind() did not use (callers may warn about them).
  virtual std::vector<std::string> unusedArrays() const { return {}; }

  // --- variable-length samples (documents: length buckets) ---------------------
  /// Whether samples have lengths of their own (sampleLength), which fillAt pads.
  virtual bool variableLength() const { return false; }
  /// Positions sample i fills, 1..T (T the bound sequence length); valid after bind().
  virtual int64_t sampleLength(int64_t i) const { (void)i; return 0; }
  /// fill() with every sequence field [length] instead of [T] (length >= each
  /// sample's sampleLength): the rest padded (tokens with the pad token, labels
  /// with the ignored label, a mask with 0). fill() is fillAt(T).
  virtual Status fillAt(std::span<const int64_t> indices, std::span<void *const> outs,
                        int64_t length) {
    (void)indices, (void)outs, (void)length;
    return Status::error("{}: samples of one length only", describe());
  }
};

/// Token shard element type.
enum class TokenDType { U16, U32 };

/// How image folders become input tensors (ImageFolderSource.cpp).
struct ImageOptions {
  int64_t resize = 0;           // shorter side before the centre crop; 0: just cover the crop
  std::vector<float> mean, std; // per channel (R, G, B) of pixel / 255, float inputs only
  bool skipBadRecords = false;  // a bad file: a warning and the next good sample, not an error
  /// Random-resized crop (training): a box of a random share of the area in [scaleMin,
  /// scaleMax] and aspect ratio in [ratioMin, ratioMax] (log-uniform) instead of the centre
  /// crop, drawn from Philox keyed by seed, epoch and sample index.
  bool randomResizedCrop = false;
  double scaleMin = 0.08, scaleMax = 1.0, ratioMin = 3.0 / 4.0, ratioMax = 4.0 / 3.0;
  uint64_t seed = 0;
  /// A bundle that crops on the device (forgec --augment pixels,canvas=HxW; build option
  /// image_crop): the crop's size. The image input is then a u8 canvas [Hc, Wc, 3] that
  /// gets each decoded image in its top-left corner (shrunk to fit), and the input
  /// IMAGE.crop [6] f32 its crop box (x0, y0, w, h, image w, image h) in those pixels,
  /// the same box as the CPU crop would take; forge.resized_crop crops and scales.
  int64_t cropHeight = 0, cropWidth = 0;
};

struct DataSourceOptions {
  TokenDType tokenDType = TokenDType::U16;
  /// Token shards as documents (forge-train --doc-separator ID): a document ends
  /// after each separator token; a sample is a document (windows of T + 1 tokens
  /// for longer ones) of its own length, padded to its length bucket.
  std::optional<int64_t> docSeparator;
  ImageOptions image;
};

/// A front end's image-folder settings (forge-train's --image-resize/--image-mean/
/// --image-std/--random-resized-crop/--crop-scale/--bad-records/--seed, the Python
/// Trainer's keywords), checked and applied by applyImageSettings in one place.
struct ImageSettings {
  int64_t resize = 0;
  std::vector<float> mean, std; // 3 values each, or none
  bool randomResizedCrop = false;
  std::vector<double> cropScale; // none, or MIN, MAX with 0 < MIN <= MAX <= 1
  bool skipBadRecords = false;
  uint64_t seed = 0; // the random-resized crops'
};

/// ImageNet's per-channel mean and std (RGB, of pixels in [0, 1]): what `imagenet`
/// normalization means in forge-train (--image-normalize), forgec's --augment
/// (normalize=imagenet) and the Python Trainer (image_normalize, via the module's
/// IMAGENET_MEAN / IMAGENET_STD).
inline constexpr double kImageNetMean[3] = {0.485, 0.456, 0.406};
inline constexpr double kImageNetStd[3] = {0.229, 0.224, 0.225};

/// How an error spells a setting: forge-train's flags (--crop-scale) or the Python
/// keywords (crop_scale).
enum class SettingSpelling { Flags, Keywords };

/// Applies `s` to `eval`'s image options (the centre crop), then makes `train` a copy of
/// `eval` with the random-resized crop when asked. Errors (a setting out of range,
/// --crop-scale without --random-resized-crop) name the setting as `spelling` writes it.
Status applyImageSettings(const ImageSettings &s, SettingSpelling spelling, DataSourceOptions &eval,
                          DataSourceOptions &train);

/// Sets `image`'s crop size from a bundle's build option image_crop ("INPUT=HxW", written
/// by forgec --augment ...,canvas=HxW); empty `value`: none. An error names the value.
Status applyImageCropOption(const std::string &value, ImageOptions &image);

/// Opens the data named by `specs`, each one of:
///   FILE.npz          arrays by name (several archives merge; a name twice is an error)
///   NAME=FILE.npy     one array
///   FILE.bin          raw little-endian token ids (GPT-style next-token batches)
///   DIR               an image folder: DIR/CLASS/*.jpg|jpeg|png (ImageNet's layout), or an
///                     LMDB of Caffe Datum records (DIR/data.mdb; also FILE.mdb)
/// Token shards, image folders and arrays do not mix. Errors name the file.
Expected<std::unique_ptr<DataSource>> openDataSource(const std::vector<std::string> &specs,
                                                     const DataSourceOptions &options = {});

/// An image folder (DIR/CLASS/IMAGE, classes in name order), decoded on the CPU
/// (libjpeg-turbo, libpng) into an image input and a class-index label input.
Expected<std::unique_ptr<DataSource>> openImageFolder(const std::string &root,
                                                      const ImageOptions &options = {});

/// An LMDB of Caffe Datum records (encoded JPEG/PNG, or raw 8-bit BGR pixels), in key
/// order, labels from the records: the same decoding and crops as image folders.
Expected<std::unique_ptr<DataSource>> openImageLmdb(const std::string &path,
                                                    const ImageOptions &options = {});

/// Image records in memory (tests, fuzzing): encoded JPEG/PNG bytes, or with `datums`
/// Caffe Datum messages; decoded, cropped and normalized as image folders are.
std::unique_ptr<DataSource> makeImageRecordSource(std::vector<std::vector<uint8_t>> records,
                                                  bool datums, const ImageOptions &options = {});

/// Arrays in memory (tests): first dim = sample. openDataSource maps .npy
/// files and stored .npz members instead (mapNpy, mapNpz).
/// `origins` names the file of each array for messages (default "<memory>").
std::unique_ptr<DataSource> makeArraySource(std::vector<std::pair<std::string, HostTensor>> arrays,
                                            std::vector<std::string> origins = {});

/// Arrays the caller owns (the Python API's batches, read in place): the same
/// checks and fills as makeArraySource, without a copy; the memory must outlive
/// the source. `origin` names them in messages.
std::unique_ptr<DataSource> makeArrayViewSource(std::vector<std::pair<std::string, MappedArray>> arrays,
                                                const std::string &origin);

/// Token ids (already in memory; tests) as a token source: sample i is the
/// window starting at token i*T, the token field gets tokens[o, o+T) and the
/// label field tokens[o+1, o+T+1).
std::unique_ptr<DataSource> makeTokenSource(std::vector<uint32_t> tokens, std::string origin);

/// Token ids in memory (tests) as documents (DataSourceOptions::docSeparator):
/// as openDataSource's FILE.bin with --doc-separator.
std::unique_ptr<DataSource> makeDocumentSource(std::vector<uint32_t> tokens, int64_t separator,
                                               std::string origin);

/// The visiting order of samples: a seeded permutation per epoch (or the
/// identity with shuffle off); each step takes the next `samplesPerStep`
/// indices and a partial remainder at the end of an epoch is dropped.
/// With groups (setGroups: length buckets), each step's samples are of one
/// group: the epoch's permutation is dealt into its groups in order, each
/// group cut into runs of samplesPerStep (its remainder dropped), and the
/// runs are visited in a seeded order of their own.
class EpochSampler {
public:
  struct Position {
    uint64_t epoch = 0;
    int64_t index = 0; // next index into the epoch's permutation
  };

  EpochSampler(int64_t numSamples, int64_t samplesPerStep, uint64_t seed, bool shuffle = true);

  int64_t stepsPerEpoch() const {
    return samplesPerStep_ ? epochSamples() / samplesPerStep_ : 0;
  }
  /// Samples an epoch's order holds: every sample, or with groups the full runs.
  int64_t epochSamples() const { return groupOf_.empty() ? numSamples_ : grouped_; }
  /// Groups of samples (groupOf[i] >= 0 for each sample i) that steps of
  /// samplesPerStep do not mix; call before the first next().
  void setGroups(std::vector<int32_t> groupOf);
  /// The group of sample i (0 without groups).
  int32_t groupOf(int64_t i) const {
    return groupOf_.empty() ? 0 : groupOf_[static_cast<size_t>(i)];
  }
  Position position() const { return pos_; }
  /// Continues from `p` (a position from position(), e.g. a checkpoint).
  void seek(Position p);
  /// The next samplesPerStep indices (valid until the next call); starts the
  /// next epoch when fewer remain. Requires stepsPerEpoch() > 0.
  std::span<const int64_t> next() { return next(samplesPerStep_); }
  /// The next `count` indices (a step of a batch-size schedule); starts the next
  /// epoch when fewer remain (the rest of this one is dropped). Empty when the
  /// data has fewer than `count` samples.
  std::span<const int64_t> next(int64_t count);
  /// Where a take of `count` samples from `p` starts (a new epoch when fewer
  /// remain), without drawing: next(count) from `p` reads [start.index, +count)
  /// of start.epoch's order and leaves the sampler at start.index + count.
  static Position startOf(Position p, int64_t count, int64_t numSamples) {
    if (p.index < 0 || p.index + count > numSamples)
      return {p.epoch + 1, 0};
    return p;
  }
  /// The full order of `epoch` (tests).
  std::vector<int64_t> orderOf(uint64_t epoch) const;

private:
  void makeOrder(uint64_t epoch);

  int64_t numSamples_, samplesPerStep_;
  uint64_t seed_;
  bool shuffle_;
  std::vector<int32_t> groupOf_;
  int64_t grouped_ = 0; // with groups: the samples of their full runs
  Position pos_;
  uint64_t orderEpoch_ = ~0ull;
  std::vector<int64_t> order_;
};

} // namespace forge::rt
