// Finding checkpoints (list_iterations, latest_iteration, the iteration folder), reading and
// checking their metadata.json, and describing them (`megatron inspect`); checkpoint.h has
// the API, shard_reader.h the pieces load.cpp shares.
#include <algorithm>
#include <filesystem>
#include <regex>
#include <sstream>

#include "base/log.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/checks.h"
#include "checkpoint/fs.h"
#include "checkpoint/megatron/megatron_import.h"
#include "checkpoint/shard_reader.h"

namespace mcpp::checkpoint {

namespace fs = std::filesystem;

std::string iterations_str(const std::vector<int64_t>& its) {
  if (its.empty()) return "none";
  std::string s;
  for (auto i : its) s += (s.empty() ? "" : ", ") + std::to_string(i);
  return s;
}

Piece piece_from_json(const json& j) {
  auto o = j.at("offsets").get<std::vector<int64_t>>();
  auto s = j.at("shape").get<std::vector<int64_t>>();
  auto l = j.at("local_offsets").get<std::vector<int64_t>>();
  MCPP_CHECK(o.size() == s.size() && s.size() == l.size() && !s.empty() && s.size() <= 2,
             "malformed piece {}", j.dump());
  Piece p;
  p.g_row = o[0], p.rows = s[0], p.l_row = l[0];
  if (s.size() == 2)
    p.g_col = o[1], p.cols = s[1], p.l_col = l[1];
  else
    p.cols = 1;
  return p;
}

// ---- finding -----------------------------------------------------------------------------------

std::vector<int64_t> list_iterations(const std::string& load_dir) {
  std::vector<int64_t> its;
  std::error_code ec;
  if (!fs::is_directory(load_dir, ec)) return its;
  static const std::regex name(R"(iter_(\d{7,}))");
  for (const auto& e : fs::directory_iterator(load_dir, ec)) {
    std::smatch m;
    const std::string n = e.path().filename().string();
    if (!e.is_directory() || !std::regex_match(n, m, name) ||
        !fs::exists(e.path() / kMetadataFile))
      continue;
    if (auto it = parse_iteration_digits(m[1]))
      its.push_back(*it);
    else
      log::warn("ignoring {}: its iteration number does not fit 64 bits", e.path().string());
  }
  std::sort(its.begin(), its.end());
  return its;
}

std::optional<int64_t> latest_iteration(const std::string& load_dir) {
  megatron::refuse_megatron_checkpoint(load_dir);  // a Megatron-LM folder: say how to convert
  const std::string tracker = join_path(load_dir, kTrackerFile);
  std::error_code ec;
  if (fs::exists(tracker, ec)) {
    std::string s = read_text_file(tracker, 4096);
    s.erase(std::remove_if(s.begin(), s.end(), ::isspace), s.end());
    if (!s.empty() && s.size() < 19 && std::all_of(s.begin(), s.end(), ::isdigit)) {
      const int64_t it = std::stoll(s);
      // A folder that exists is trusted (if it is broken, loading says so). A missing one
      // means a re-save of this iteration was interrupted while the old copy was moved aside.
      if (fs::exists(fs::path(load_dir) / iteration_dir_name(it), ec)) return it;
      auto its = list_iterations(load_dir);
      if (its.empty()) {
        // Megatron stops here too: starting from random weights would silently throw the
        // run away (and the next save would replace the tracker).
        std::string aside;
        for (const auto& e : fs::directory_iterator(load_dir, ec))
          if (e.path().filename().string().rfind(iteration_dir_name(it) + ".old-", 0) == 0)
            aside = e.path().string();
        throw Error(
            fmt::format("{} names iteration {}, but {} does not exist and {} holds no other "
                        "complete checkpoint",
                        tracker, it, join_path(load_dir, iteration_dir_name(it)), load_dir),
            aside.empty()
                ? "restore the checkpoint folder, or start fresh without --load (or with "
                  "another --load folder)"
                : fmt::format("a re-save of that iteration was interrupted; its previous copy "
                              "is {}: rename it to {}",
                              aside, iteration_dir_name(it)));
      }
      log::warn(
          "{} names iteration {}, whose folder is missing; using the newest complete "
          "checkpoint, iteration {}",
          tracker, it, its.back());
      return its.back();
    }
    log::warn("{} holds '{}', not an iteration number; using the newest complete checkpoint",
              tracker, s.substr(0, 40));
  }
  auto its = list_iterations(load_dir);
  if (its.empty()) return std::nullopt;
  if (!fs::exists(tracker, ec))
    log::warn("{} has no {}; using the newest complete checkpoint, iteration {}", load_dir,
              kTrackerFile, its.back());
  return its.back();
}

std::string resolve_iter_dir(const std::string& dir, std::optional<int64_t> iteration) {
  megatron::refuse_megatron_checkpoint(dir, iteration);
  if (!iteration && fs::exists(fs::path(dir) / kMetadataFile)) return dir;  // an iter_* dir
  std::optional<int64_t> it = iteration ? iteration : latest_iteration(dir);
  MCPP_CHECK_HINT(it.has_value(),
                  "check --load; a checkpoint directory holds iter_XXXXXXX/ folders and " +
                      std::string(kTrackerFile),
                  "no checkpoint found in {}", dir);
  return join_path(dir, iteration_dir_name(*it));
}

json parse_metadata(const std::string& iter_dir) {
  const std::string path = join_path(iter_dir, kMetadataFile);
  MCPP_CHECK(fs::is_directory(iter_dir), "{} does not exist", iter_dir);
  MCPP_CHECK(fs::exists(path),
             "{} is missing: the checkpoint is incomplete (a save was interrupted or files were "
             "deleted)",
             path);
  json md;
  try {
    md = json::parse(read_text_file(path));
  } catch (const json::exception& e) {
    MCPP_FAIL("{} is not valid JSON ({}): the file is corrupt", path, e.what());
  }
  MCPP_CHECK(md.is_object() && md.contains("format") && md["format"] == "megatron.cpp checkpoint",
             "{} is not a megatron.cpp checkpoint metadata file", path);
  MCPP_CHECK(md.contains("format_version") && md["format_version"].is_number_integer(),
             "{}: format_version is {}, expected an integer", path,
             md.contains("format_version") ? md["format_version"].dump() : "absent");
  const int64_t v = md["format_version"].get<int64_t>();
  MCPP_CHECK_HINT(v >= 1 && v <= kFormatVersion, "use a newer megatron.cpp to read it",
                  "{} has format version {}, this build reads 1..{}", path, v, kFormatVersion);
  for (const char* k : {"tensors", "files", "state", "iteration"})
    MCPP_CHECK(md.contains(k), "{} lacks the field '{}'", path, k);
  for (const char* k : {"tensors", "files", "state"})
    MCPP_CHECK(md[k].is_object(), "{}: '{}' is not a JSON object", path, k);
  MCPP_CHECK(md["iteration"].is_number_integer() && md["iteration"].get<int64_t>() >= 0,
             "{}: iteration is {}, expected a non-negative integer", path,
             md["iteration"].dump());
  // The folder's name is what the tracker and --ckpt-step select: the metadata inside must
  // describe that iteration, or a converter would export another one than asked.
  static const std::regex name(R"(iter_(\d+))");
  std::smatch m;
  const std::string base = fs::path(iter_dir).filename().string();
  if (std::regex_match(base, m, name)) {
    const auto folder_it = parse_iteration_digits(m[1]);
    MCPP_CHECK_HINT(folder_it == md["iteration"].get<int64_t>(),
                    "the folder was renamed or its metadata.json replaced; restore it",
                    "{} says iteration {}, but its folder is {}", path, md["iteration"].dump(),
                    base);
  }
  md["__iter_dir"] = iter_dir;  // for messages and the file-size checks; never saved
  return md;
}

json read_metadata(const std::string& dir, std::optional<int64_t> iteration) {
  return parse_metadata(resolve_iter_dir(dir, iteration));
}

// ---- inspection --------------------------------------------------------------------------------

std::string describe_checkpoint(const std::string& dir, int* bad_shards) {
  const std::string iter_dir = resolve_iter_dir(dir, std::nullopt);
  const json md = parse_metadata(iter_dir);
  try {
  std::ostringstream o;
  o << "checkpoint " << iter_dir << "\n";
  o << "  format version " << md["format_version"] << ", written by megatron.cpp "
    << md.value("mcpp_version", "?") << ", checksums " << md.value("checksum_algorithm", "?")
    << "\n";
  if (fs::exists(fs::path(dir) / kTrackerFile)) {
    auto its = list_iterations(dir);
    o << "  iterations present: " << iterations_str(its)
      << " (tracker: " << read_text_file(join_path(dir, kTrackerFile), 4096) << ")\n";
  }
  const json& s = md["state"];
  o << "  iteration " << s["iteration"] << ", consumed samples train "
    << s["consumed_train_samples"] << " valid " << s["consumed_valid_samples"]
    << ", optimizer steps " << s["optimizer_steps"] << ", optimizer state "
    << (md.value("has_optimizer", false) ? "yes" : "no") << "\n";
  o << "  scheduler " << s["opt_param_scheduler"].dump() << "\n";
  o << "  rng " << s["rng"].dump() << ", data loader " << s["data_loader"].dump() << "\n";
  if (md.contains("model")) o << "  model " << md["model"].dump() << "\n";
  if (!s["config"].empty()) o << "  config " << s["config"].dump() << "\n";
  o << "  files:\n";
  for (auto& [f, v] : md["files"].items()) o << "    " << f << "  " << v["bytes"] << " bytes\n";
  o << "  tensors (key, global shape, dtype, split: shards file[rows,cols @ offsets] status):\n";
  ShardReader rd(iter_dir, md, true);
  int bad = 0;
  for (auto& [key, t] : md["tensors"].items()) {
    o << "    " << key << "  " << shape_str(t["global_shape"].get<Shape>()) << " "
      << t["dtype"].get<std::string>() << " " << t["split"].get<std::string>()
      << (t.is_object() && t.value("buffer", false) ? " (buffer)" : "") << ":";
    for (const json& sh : t["shards"]) {
      o << " " << sh["file"].get<std::string>();
      for (const json& p : sh["pieces"]) o << p["shape"].dump() << "@" << p["offsets"].dump();
      try {
        const Shape g = t.at("global_shape").get<Shape>(), ss = sh.at("shape").get<Shape>();
        check_shape(g, "tensor " + key);
        check_shape(ss, "tensor " + key + ": shard shape");
        for (const json& p : sh.at("pieces")) check_piece(piece_from_json(p), g, ss, key);
        rd.shard(key, sh);
        rd.release();
        o << " ok";
      } catch (const Error& e) {
        ++bad;
        o << " BAD (" << e.summary() << ")";
      } catch (const json::exception& e) {
        ++bad;
        o << " BAD (malformed shard entry: " << e.what() << ")";
      }
    }
    o << "\n";
  }
  o << "  "
    << (bad ? std::to_string(bad) + " shard(s) failed verification" : "all checksums verified")
    << "\n";
  if (bad_shards) *bad_shards = bad;
  return o.str();
  } catch (const json::exception& e) {
    throw Error(fmt::format("{}/{}: malformed metadata: {}", iter_dir, kMetadataFile, e.what()));
  }
}

}  // namespace mcpp::checkpoint
