// A plain main() for FuzzBundleLoader.cpp, so CI exercises the fuzz entry
// point without libFuzzer (any compiler):
//   FuzzBundleLoaderSmoke [--iterations N] [--seed S]   built-in seeds, mutated
//   FuzzBundleLoaderSmoke FILE|DIR...                    replay inputs (crashes)
//   FuzzBundleLoaderSmoke --write-seeds DIR              seed corpus for libFuzzer
// Seeds are small valid bundles made with BundleWriter; mutations are both
// raw (bit flips, interesting values over header fields, truncation, splices)
// and structured (out-of-range indices, offsets and sizes written through the
// writer, so checksums are right and the semantic checks are reached).
// Deterministic for a given seed.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "forge/runtime/Bundle.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

using namespace forge::rt;
namespace fb = forge::bundle;

namespace {

struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t below(uint64_t n) { return n ? next() % n : 0; }
};

std::vector<uint8_t> floats(std::vector<float> v) {
  std::vector<uint8_t> out(v.size() * 4);
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

fb::TensorInfo *tensor(fb::Program &p, const char *name, fb::TensorInfo::Kind kind,
                       std::vector<int64_t> shape, int64_t arena = 0) {
  fb::TensorInfo *t = p.add_tensors();
  t->set_name(name);
  t->set_dtype(fb::F32);
  t->set_kind(kind);
  for (int64_t d : shape)
    t->add_shape(d);
  t->set_arena_offset(arena);
  return t;
}

/// The routine called `name`, created when absent.
fb::Routine *routine(fb::Program &p, const char *name = "forward") {
  for (fb::Routine &r : *p.mutable_routines())
    if (r.name() == name)
      return &r;
  fb::Routine *r = p.add_routines();
  r->set_name(name);
  return r;
}

void inst(fb::Program &p, const char *op, std::vector<int32_t> in, std::vector<int32_t> out,
          const char *routineName = "forward") {
  fb::Routine *r = routine(p, routineName);
  fb::Instruction *i = r->add_instructions();
  i->set_op(op);
  i->set_name(std::string("n") + std::to_string(r->instructions_size()));
  for (int32_t t : in)
    i->add_inputs(t);
  for (int32_t t : out)
    i->add_outputs(t);
}

/// Valid seed bundles as (program, section contents) so structured mutations
/// can rebuild them.
struct Seed {
  fb::Program program; // without sections
  std::vector<std::pair<std::string, std::vector<uint8_t>>> sections;
};

std::vector<Seed> makeSeeds() {
  std::vector<Seed> seeds;
  {
    Seed s; // y = relu(x + b) @ w
    fb::Program &p = s.program;
    p.set_target("cpu");
    p.set_producer("fuzz-seed");
    (*p.mutable_build_options())["precision"] = "f32";
    s.sections.push_back(
        {"params", floats({1, 2, 3, 4, 5, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, -1, 2, -2, 3, -3})});
    tensor(p, "x", fb::TensorInfo::INPUT, {2, 3}, 0);
    fb::TensorInfo *b = tensor(p, "b", fb::TensorInfo::CONSTANT, {2, 3});
    b->set_data_size(24);
    tensor(p, "s", fb::TensorInfo::INTERMEDIATE, {2, 3}, 64);
    tensor(p, "r", fb::TensorInfo::INTERMEDIATE, {2, 3}, 128);
    fb::TensorInfo *w = tensor(p, "w", fb::TensorInfo::PARAMETER, {3, 2});
    w->set_data_offset(64);
    w->set_data_size(24);
    w->set_role("weight");
    tensor(p, "y", fb::TensorInfo::OUTPUT, {2, 2}, 0);
    p.set_arena_size(192);
    inst(p, "add", {0, 1}, {2});
    inst(p, "relu", {2}, {3});
    inst(p, "matmul", {3, 4}, {5});
    (*routine(p)->mutable_instructions(2)->mutable_attrs())["note"].set_s("seed");
    routine(p)->add_inputs(0);
    routine(p)->add_outputs(5);
    seeds.push_back(std::move(s));
  }
  {
    Seed s; // two routines, optional operand, a written parameter, state, two sections, i64
    fb::Program &p = s.program;
    p.set_target("cpu");
    p.set_training(true);
    s.sections.push_back({"a", floats({0.5f, 0.25f})});
    s.sections.push_back({"b", std::vector<uint8_t>(16, 1)});
    tensor(p, "x", fb::TensorInfo::INPUT, {2}, 0);
    fb::TensorInfo *w = tensor(p, "w", fb::TensorInfo::PARAMETER, {2});
    w->set_data_size(8);
    fb::TensorInfo *c = tensor(p, "c", fb::TensorInfo::CONSTANT, {2});
    c->set_dtype(fb::I64);
    c->set_section(1);
    c->set_data_size(16);
    tensor(p, "y", fb::TensorInfo::OUTPUT, {2}, 64);
    p.set_arena_size(128);
    tensor(p, "m", fb::TensorInfo::STATE, {2});                          // 4: zeros
    fb::TensorInfo *v = tensor(p, "v", fb::TensorInfo::STATE, {2});      // 5: from bytes
    v->set_data_size(8);
    tensor(p, "x_eval", fb::TensorInfo::INPUT, {2}, 0);                  // 6
    tensor(p, "loss", fb::TensorInfo::OUTPUT, {2}, 64);                  // 7
    inst(p, "add", {0, 1, -1}, {3}, "train_step");
    inst(p, "relu", {3}, {1}, "train_step");
    inst(p, "add", {4, 5}, {4}, "train_step");
    inst(p, "copy", {3}, {5}, "train_step");
    routine(p, "train_step")->add_inputs(0);
    routine(p, "train_step")->add_outputs(3);
    inst(p, "mul", {6, 1}, {7}, "eval");
    routine(p, "eval")->add_inputs(6);
    routine(p, "eval")->add_outputs(7);
    seeds.push_back(std::move(s));
  }
  {
    Seed s; // empty program
    seeds.push_back(std::move(s));
  }
  {
    Seed s; // an op without a CPU kernel
    fb::Program &p = s.program;
    tensor(p, "x", fb::TensorInfo::INPUT, {4}, 0);
    tensor(p, "y", fb::TensorInfo::OUTPUT, {4}, 64);
    p.set_arena_size(128);
    inst(p, "no_such_op", {0}, {1});
    seeds.push_back(std::move(s));
  }
  return seeds;
}

/// The seed's program with its section table filled in.
fb::Program withSections(const Seed &s) {
  BundleWriter w;
  for (const auto &[name, bytes] : s.sections)
    w.addSection(name, bytes);
  fb::Program p = s.program;
  p.mutable_sections()->CopyFrom(w.program().sections());
  return p;
}

/// A file image with the seed's section bytes and `program` (whose section
/// table may have been mutated) as the Program message.
std::vector<uint8_t> build(const Seed &s, const fb::Program &program) {
  BundleWriter w;
  for (const auto &[name, bytes] : s.sections)
    w.addSection(name, bytes);
  w.program() = program;
  return w.serialize();
}

const int64_t kInteresting[] = {0,         1,         -1,        2,         63,          64,
                                65,        127,       128,       4096,      INT32_MAX,   INT32_MIN,
                                INT64_MAX, INT64_MIN, 1ll << 32, 1ll << 40, (1ll << 62), -64};

int64_t interesting(Rng &r) { return kInteresting[r.below(std::size(kInteresting))]; }

/// A random routine of `p`, or nullptr when it has none.
fb::Routine *anyRoutine(fb::Program &p, Rng &r) {
  return p.routines_size() ? p.mutable_routines(static_cast<int>(r.below(p.routines_size())))
                           : nullptr;
}

/// One structured change to a seed's program (sections already filled in).
void mutateProgram(fb::Program &p, Rng &r) {
  fb::Routine *rt = anyRoutine(p, r);
  fb::Routine empty;
  fb::Routine &q = rt ? *rt : empty;
  switch (r.below(14)) {
  case 0:
    if (q.instructions_size()) {
      fb::Instruction *i = q.mutable_instructions(r.below(q.instructions_size()));
      if (i->inputs_size())
        i->set_inputs(r.below(i->inputs_size()), static_cast<int32_t>(interesting(r)));
    }
    break;
  case 1:
    if (q.instructions_size()) {
      fb::Instruction *i = q.mutable_instructions(r.below(q.instructions_size()));
      if (i->outputs_size())
        i->set_outputs(r.below(i->outputs_size()), static_cast<int32_t>(r.below(8)) - 1);
    }
    break;
  case 2:
    if (p.tensors_size()) {
      fb::TensorInfo *t = p.mutable_tensors(r.below(p.tensors_size()));
      if (t->shape_size())
        t->set_shape(r.below(t->shape_size()), interesting(r));
      else
        t->add_shape(interesting(r));
    }
    break;
  case 3:
    if (p.tensors_size())
      p.mutable_tensors(r.below(p.tensors_size()))->set_arena_offset(interesting(r));
    break;
  case 4:
    if (p.tensors_size()) {
      fb::TensorInfo *t = p.mutable_tensors(r.below(p.tensors_size()));
      t->set_data_offset(static_cast<uint64_t>(interesting(r)));
      if (r.below(2))
        t->set_data_size(static_cast<uint64_t>(interesting(r)));
    }
    break;
  case 5:
    if (p.tensors_size()) {
      fb::TensorInfo *t = p.mutable_tensors(r.below(p.tensors_size()));
      t->set_dtype(static_cast<fb::DType>(r.below(20)));
      t->set_kind(static_cast<fb::TensorInfo::Kind>(r.below(7)));
      t->set_section(static_cast<uint32_t>(r.below(4)));
    }
    break;
  case 6:
    if (p.sections_size()) {
      fb::Section *s = p.mutable_sections(r.below(p.sections_size()));
      if (r.below(2))
        s->set_offset(static_cast<uint64_t>(interesting(r)));
      else
        s->set_size(static_cast<uint64_t>(interesting(r)));
    }
    break;
  case 7:
    p.set_arena_size(static_cast<uint64_t>(interesting(r)));
    break;
  case 8:
    if (r.below(2))
      q.add_inputs(static_cast<int32_t>(interesting(r)));
    else
      q.add_outputs(static_cast<int32_t>(interesting(r)));
    break;
  case 9:
    if (q.instructions_size())
      q.mutable_instructions(r.below(q.instructions_size()))->set_op(r.below(2) ? "" : "matmul");
    break;
  case 11: // duplicate, empty or renamed routines; routines sharing arena tensors
    switch (r.below(3)) {
    case 0:
      if (rt)
        *p.add_routines() = *rt;
      break;
    case 1:
      q.set_name(r.below(2) ? "" : "eval");
      break;
    default:
      if (rt && p.routines_size() > 1)
        p.mutable_routines()->SwapElements(0, p.routines_size() - 1);
      p.add_routines()->set_name("extra");
      if (p.tensors_size())
        p.mutable_routines(p.routines_size() - 1)->add_outputs(
            static_cast<int32_t>(r.below(p.tensors_size())));
      break;
    }
    break;
  case 12:
    if (p.tensors_size()) {
      fb::TensorInfo *t = p.mutable_tensors(r.below(p.tensors_size()));
      t->set_kind(fb::TensorInfo::STATE);
      if (r.below(2))
        t->set_data_size(0);
    }
    break;
  case 10: {
    fb::Section *s = p.add_sections();
    s->set_offset(static_cast<uint64_t>(interesting(r)) & ~63ull);
    s->set_size(r.below(256));
    break;
  }
  default:
    if (p.tensors_size() && r.below(2))
      p.mutable_tensors()->RemoveLast();
    else if (q.instructions_size())
      q.mutable_instructions()->RemoveLast();
    else if (p.routines_size())
      p.mutable_routines()->RemoveLast();
    break;
  }
}

/// One raw change to a file image.
void mutateBytes(std::vector<uint8_t> &b, Rng &r) {
  if (b.empty())
    return;
  switch (r.below(6)) {
  case 0:
    for (uint64_t n = 1 + r.below(8); n--;)
      b[r.below(b.size())] ^= static_cast<uint8_t>(1u << r.below(8));
    break;
  case 1: { // an interesting 64- or 32-bit value over a header field
    size_t pos = r.below(sizeof(BundleHeader) / 4) * 4;
    int64_t v = interesting(r);
    size_t width = r.below(2) ? 8 : 4;
    if (pos + width <= b.size())
      std::memcpy(b.data() + pos, &v, width);
    break;
  }
  case 2:
    b.resize(r.below(b.size()));
    break;
  case 3: {
    size_t pos = r.below(b.size());
    b.insert(b.begin() + pos, 1 + r.below(70), static_cast<uint8_t>(r.next()));
    break;
  }
  case 4: {
    size_t pos = r.below(b.size());
    b.erase(b.begin() + pos, b.begin() + std::min(b.size(), pos + 1 + r.below(70)));
    break;
  }
  default:
    b[r.below(b.size())] = static_cast<uint8_t>(interesting(r));
    break;
  }
}

int runFile(const std::filesystem::path &path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<uint8_t> b{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  LLVMFuzzerTestOneInput(b.data(), b.size());
  return 1;
}

} // namespace

int main(int argc, char **argv) {
  uint64_t iterations = 20000, seed = 1;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--iterations" && i + 1 < argc) {
      iterations = std::stoull(argv[++i]);
    } else if (a == "--seed" && i + 1 < argc) {
      seed = std::stoull(argv[++i]);
    } else if (a == "--write-seeds" && i + 1 < argc) {
      std::filesystem::path dir = argv[++i];
      std::filesystem::create_directories(dir);
      int n = 0;
      for (const Seed &s : makeSeeds()) {
        std::vector<uint8_t> b = build(s, withSections(s));
        std::ofstream(dir / ("seed" + std::to_string(n++) + ".forge"), std::ios::binary)
            .write(reinterpret_cast<const char *>(b.data()), b.size());
      }
      std::printf("wrote %d seeds to %s\n", n, dir.c_str());
      return 0;
    } else if (a.starts_with("-")) {
      std::fprintf(stderr,
                   "usage: %s [--iterations N] [--seed S] [--write-seeds DIR] [FILE|DIR...]\n",
                   argv[0]);
      return 2;
    } else {
      files.push_back(a);
    }
  }
  if (!files.empty()) {
    int n = 0;
    for (const std::string &f : files) {
      if (std::filesystem::is_directory(f)) {
        for (const auto &e : std::filesystem::directory_iterator(f))
          if (e.is_regular_file())
            n += runFile(e.path());
      } else {
        n += runFile(f);
      }
    }
    std::printf("ran %d inputs\n", n);
    return 0;
  }

  std::vector<Seed> seeds = makeSeeds();
  std::vector<std::vector<uint8_t>> images;
  for (const Seed &s : seeds) {
    images.push_back(build(s, withSections(s)));
    // Seeds must load: otherwise the mutations test nothing deep.
    if (!Bundle::fromBytes(images.back()).isOk()) {
      std::fprintf(stderr, "seed %zu does not load: %s\n", images.size() - 1,
                   Bundle::fromBytes(images.back()).status().message().c_str());
      return 1;
    }
  }
  Rng r{seed};
  uint64_t loaded = 0;
  for (uint64_t it = 0; it < iterations; ++it) {
    size_t k = r.below(seeds.size());
    std::vector<uint8_t> b;
    if (r.below(2)) {
      fb::Program q = withSections(seeds[k]);
      for (uint64_t n = 1 + r.below(3); n--;)
        mutateProgram(q, r);
      b = build(seeds[k], q);
    } else {
      b = images[k];
      for (uint64_t n = 1 + r.below(3); n--;)
        mutateBytes(b, r);
    }
    LLVMFuzzerTestOneInput(b.data(), b.size());
    loaded += Bundle::fromBytes(b).isOk();
  }
  std::printf("%llu mutated bundles, %llu loaded, no crash\n",
              static_cast<unsigned long long>(iterations), static_cast<unsigned long long>(loaded));
  return 0;
}
