// The communicator interface on the local backend (a group of one, no MPI): the
// argument checks every backend shares, numbering, statistics, the timeout message.
#include <gtest/gtest.h>

#include <map>

#include "comm/fake/fake_communicator.h"
#include "comm/local/local_communicator.h"
#include "comm/world.h"
#include "parallel/parallel_state.h"

using namespace mcpp;
using namespace mcpp::comm;

namespace {
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
Tensor iota(const Shape& s) {
  Tensor t = Tensor::empty(s, DType::F32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(i);
  return t;
}
bool same(const Tensor& a, const Tensor& b) {
  if (a.numel() != b.numel()) return false;
  for (int64_t i = 0; i < a.numel(); ++i)
    if (a.data<float>()[i] != b.data<float>()[i]) return false;
  return true;
}
}  // namespace

TEST(LocalComm, CollectivesAreCopies) {
  auto w = init({.backend = Backend::Local});
  EXPECT_EQ(w->size(), 1);
  EXPECT_EQ(w->backend(), "local");
  Communicator& c = w->world();
  Stream& s = Stream::cpu();
  Tensor x = iota({4, 3}), y = Tensor::zeros({4, 3}, DType::F32);
  c.all_reduce(x, ReduceOp::Sum, s);
  EXPECT_TRUE(same(x, iota({4, 3})));
  c.all_gather(x, y, s);
  EXPECT_TRUE(same(y, x));
  y = Tensor::zeros({4, 3}, DType::F32);
  c.reduce_scatter(x, y, s);
  EXPECT_TRUE(same(y, x));
  std::vector<int64_t> rows{4};
  y = Tensor::zeros({4, 3}, DType::F32);
  c.all_to_allv(x, rows, y, rows, s);
  EXPECT_TRUE(same(y, x));
  c.broadcast(x, 0, s);
  c.barrier(s);
  // Send to oneself: posted first, received after.
  Tensor r = Tensor::zeros({4, 3}, DType::F32);
  Work ws = c.send_async(x, 0, s);
  c.recv(r, 0, s);
  ws.wait();
  EXPECT_TRUE(same(r, x));
  EXPECT_EQ(c.sequence(), 6u);  // p2p calls are numbered per peer, not here
  EXPECT_EQ(c.stats().calls[int(OpKind::AllReduce)], 1u);
  EXPECT_EQ(c.stats().bytes[int(OpKind::AllGather)], 48u);
  EXPECT_EQ(c.stats().calls[int(OpKind::Send)], 1u);
}

TEST(LocalComm, ArgumentErrors) {
  auto w = init({.backend = Backend::Local});
  Communicator& c = w->world();
  Stream& s = Stream::cpu();
  Tensor x = iota({4, 3}), bad = Tensor::zeros({5, 3}, DType::F32);
  EXPECT_NE(error_of([&] { c.all_gather(x, bad, s); })
                .find("all_gather on group 'world' (world ranks [0]): output f32[5, 3] cpu must "
                      "be input f32[4, 3] cpu with dim 0 times 1"),
            std::string::npos);
  // all_gather in place is this rank's block of the output; any other overlap is an error.
  Tensor buf = iota({5, 3});
  Tensor out = buf.narrow(0, 4), in = buf.narrow(1, 4);
  EXPECT_NE(error_of([&] { c.all_gather(in, out, s); }).find("overlaps output"), std::string::npos);
  c.all_gather(out, out, s);
  EXPECT_TRUE(same(out, iota({5, 3}).narrow(0, 4)));
  EXPECT_NE(error_of([&] { c.send(x, 1, s); }).find("peer 1 is not a group rank"),
            std::string::npos);
  Tensor u8 = Tensor::zeros({4}, DType::U8);
  EXPECT_NE(error_of([&] { c.all_reduce(u8, ReduceOp::Sum, s); }).find("cannot reduce u8"),
            std::string::npos);
  std::vector<int64_t> rows{3};
  Tensor y = Tensor::zeros({4, 3}, DType::F32);
  EXPECT_NE(error_of([&] { c.all_to_allv(x, rows, y, rows, s); }).find("counts sum to 3"),
            std::string::npos);
  // A recv from oneself with no send can never complete: an error, not a hang.
  EXPECT_NE(error_of([&] { c.recv(y, 0, s); }).find("would never complete"), std::string::npos);
}

TEST(LocalComm, TimeoutMessage) {
  LocalCommunicator c("dp", 5, std::chrono::seconds(3));
  OpDesc d;
  d.kind = OpKind::AllReduce, d.seq = 17, d.bytes = 4096, d.detail = "sum f32[1024] cpu";
  std::string m = c.timeout_message(d, 3.04);
  EXPECT_NE(m.find("communication timeout on world rank 5: group 'dp' (world ranks [5]) "
                   "all_reduce sequence number 17: sum f32[1024] cpu (4096 bytes) did not "
                   "complete within 3.0 s"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("HINT:"), std::string::npos);
}

TEST(LocalComm, ParallelStateOfOne) {
  auto w = init({.backend = Backend::Local});
  parallel::ParallelState ps(*w, {});
  EXPECT_EQ(ps.tp().size(), 1);
  EXPECT_EQ(ps.dp().name(), "dp");
  EXPECT_TRUE(ps.is_first_stage() && ps.is_last_stage());
  EXPECT_TRUE(ps.has(parallel::Group::Embedding));
  parallel::ParallelSizes bad;
  bad.tp = 2;
  EXPECT_NE(error_of([&] {
              parallel::ParallelState p(*w, bad);
            }).find("world size 1 is not divisible by tensor (2)"),
            std::string::npos);
}

// --nccl-communicator-config-path: Megatron's YAML (group -> ncclConfig_t fields).
namespace {
std::string write_tmp(const std::string& name, const std::string& text) {
  std::string p = ::testing::TempDir() + name;
  FILE* f = std::fopen(p.c_str(), "w");
  std::fputs(text.c_str(), f);
  std::fclose(f);
  return p;
}
}  // namespace

TEST(NcclConfig, ReadsMegatronYaml) {
  auto p = write_tmp("nccl_ok.yaml",
                     "# comment\n"
                     "dp:\n"
                     "  max_ctas: 8   # few SMs for the overlapped reduction\n"
                     "  min_ctas: 1\n"
                     "\n"
                     "tp_dp_cp:\n"
                     "  cga_cluster_size: 2\n");
  NcclConfigs c = read_nccl_config(p);
  ASSERT_EQ(c.size(), 2u);
  const NcclGroupConfig* dp = find_nccl_config(c, "dp");
  ASSERT_NE(dp, nullptr);
  EXPECT_EQ(dp->max_ctas, 8);
  EXPECT_EQ(dp->min_ctas, 1);
  EXPECT_EQ(dp->cga_cluster_size, -1);
  const NcclGroupConfig* g = find_nccl_config(c, "tp-dp-cp");  // our name of tp_dp_cp
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->cga_cluster_size, 2);
  EXPECT_EQ(find_nccl_config(c, "tp"), nullptr);
}

TEST(NcclConfig, BadFilesNameTheLine) {
  EXPECT_NE(error_of([] {
              read_nccl_config("/nonexistent/nccl.yaml");
            }).find("cannot open '/nonexistent/nccl.yaml'"),
            std::string::npos);
  auto p = write_tmp("nccl_bad1.yaml", "dp:\n  max_ctas: eight\n");
  EXPECT_NE(error_of([&] { read_nccl_config(p); })
                .find("nccl_bad1.yaml:2: 'max_ctas' of group "
                      "'dp' must be a non-negative integer"),
            std::string::npos);
  p = write_tmp("nccl_bad2.yaml", "dp:\n  max_ctaz: 4\n");
  EXPECT_NE(error_of([&] { read_nccl_config(p); }).find("unknown field 'max_ctaz'"),
            std::string::npos);
  p = write_tmp("nccl_bad3.yaml", "  max_ctas: 4\n");
  EXPECT_NE(error_of([&] { read_nccl_config(p); }).find("before any group name"),
            std::string::npos);
  p = write_tmp("nccl_bad4.yaml", "dp:\n  max_ctas: 2\n  min_ctas: 4\n");
  EXPECT_NE(error_of([&] { read_nccl_config(p); }).find("min_ctas 4 > max_ctas 2"),
            std::string::npos);
}

// ---- torchrun-style launches (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, no MPI) -------

namespace {
using Env = std::map<std::string, std::string>;
std::function<const char*(const char*)> env_of(const Env& m) {
  return [m](const char* n) -> const char* {
    auto it = m.find(n);
    return it == m.end() ? nullptr : it->second.c_str();
  };
}
std::string launch_error(const Env& m) {
  return error_of([&] { detect_launch(env_of(m)); });
}
const Env kTorchrun = {{"RANK", "3"},
                       {"WORLD_SIZE", "4"},
                       {"LOCAL_RANK", "1"},
                       {"MASTER_ADDR", "node7"},
                       {"MASTER_PORT", "29500"}};
Env with(Env m, const std::string& k, const char* v) {
  if (v)
    m[k] = v;
  else
    m.erase(k);
  return m;
}
}  // namespace

TEST(Launch, TorchrunDetected) {
  LaunchInfo li = detect_launch(env_of(kTorchrun));
  EXPECT_EQ(li.launcher, "torchrun");
  EXPECT_EQ(li.size, 4);
  EXPECT_EQ(li.rank, 3);
  EXPECT_EQ(li.local_rank, 1);
  EXPECT_EQ(li.master_addr, "node7");
  EXPECT_EQ(li.master_port, 29500);
  EXPECT_EQ(li.rendezvous_port, 29500);
  // torchrun's agent serves its own store on MASTER_PORT: the rendezvous takes the next port,
  // and MCPP_RENDEZVOUS_PORT overrides both.
  Env agent = with(kTorchrun, "TORCHELASTIC_USE_AGENT_STORE", "True");
  EXPECT_EQ(detect_launch(env_of(agent)).rendezvous_port, 29501);
  EXPECT_EQ(detect_launch(env_of(with(agent, "MCPP_RENDEZVOUS_PORT", "4000"))).rendezvous_port,
            4000);
  // An MPI launcher wins over stray torchrun variables.
  EXPECT_EQ(detect_launch(env_of(with(kTorchrun, "OMPI_COMM_WORLD_SIZE", "2"))).launcher, "mpirun");
  // torchrun started by srun: its workers inherit the srun step's variables, but follow
  // torchrun's RANK/WORLD_SIZE.
  Env under_srun = with(with(with(kTorchrun, "SLURM_STEP_NUM_TASKS", "2"), "SLURM_PROCID", "1"),
                        "TORCHELASTIC_RUN_ID", "job42");
  li = detect_launch(env_of(under_srun));
  EXPECT_EQ(li.launcher, "torchrun");
  EXPECT_EQ(li.size, 4);
  EXPECT_EQ(detect_launch(env_of(with(under_srun, "TORCHELASTIC_RUN_ID", nullptr))).launcher,
            "srun");
  // WORLD_SIZE 1 is a local run and needs no rendezvous address.
  li = detect_launch(env_of({{"RANK", "0"}, {"WORLD_SIZE", "1"}}));
  EXPECT_EQ(li.launcher, "torchrun");
  EXPECT_EQ(li.size, 1);
  auto w = init({.backend = Backend::Local});
  EXPECT_EQ(w->size(), 1);
}

TEST(Launch, TorchrunErrorsNameTheVariable) {
  EXPECT_NE(launch_error(with(kTorchrun, "WORLD_SIZE", nullptr))
                .find("environment variable WORLD_SIZE is not set"),
            std::string::npos);
  EXPECT_NE(
      launch_error(with(kTorchrun, "RANK", nullptr)).find("environment variable RANK is not set"),
      std::string::npos);
  EXPECT_NE(launch_error(with(kTorchrun, "RANK", "4")).find("RANK=4 is not below WORLD_SIZE=4"),
            std::string::npos);
  EXPECT_NE(launch_error(with(kTorchrun, "RANK", "x1")).find("RANK='x1' is not a non-negative"),
            std::string::npos);
  EXPECT_NE(launch_error(with(kTorchrun, "WORLD_SIZE", "99999999999"))
                .find("WORLD_SIZE='99999999999' is not a non-negative"),
            std::string::npos);
  EXPECT_NE(launch_error(with(kTorchrun, "MASTER_ADDR", nullptr))
                .find("environment variable MASTER_ADDR is not set"),
            std::string::npos);
  EXPECT_NE(launch_error(with(kTorchrun, "MASTER_PORT", nullptr))
                .find("environment variable MASTER_PORT is not set"),
            std::string::npos);
  EXPECT_NE(launch_error(with(kTorchrun, "MASTER_PORT", "70000"))
                .find("MASTER_PORT=70000 is not a TCP port"),
            std::string::npos);
  // torchrun's own hints alone (no RANK) are a launch with its variables missing.
  EXPECT_NE(launch_error({{"TORCHELASTIC_RUN_ID", "abc"}}).find("WORLD_SIZE is not set"),
            std::string::npos);
  EXPECT_NE(launch_error({{"LOCAL_RANK", "0"}}).find("HINT: torchrun sets RANK"),
            std::string::npos);
}

// ---- --fake-process-group: one process plays one rank; the others hold its data ------------

TEST(FakeComm, EveryOtherMemberHoldsThisRanksData) {
  // Group rank 2 of a group of 4 (world ranks 1, 3, 5, 7).
  FakeCommunicator c("tp", {1, 3, 5, 7}, 2, std::chrono::seconds(5));
  EXPECT_EQ(c.size(), 4);
  EXPECT_EQ(c.world_rank(), 5);
  EXPECT_EQ(c.backend(), "fake");
  Stream& s = Stream::cpu();
  Tensor x = iota({2, 3});
  c.all_reduce(x, ReduceOp::Sum, s);  // floating point: this rank's values keep their scale
  EXPECT_TRUE(same(x, iota({2, 3})));
  Tensor n = Tensor::from(std::vector<int64_t>{3, -1}, {2});  // counts: four equal ones summed
  c.all_reduce(n, ReduceOp::Sum, s);
  EXPECT_EQ(n.data<int64_t>()[0], 12);
  EXPECT_EQ(n.data<int64_t>()[1], -4);
  x = iota({2, 3});
  c.all_reduce(x, ReduceOp::Max, s);
  EXPECT_TRUE(same(x, iota({2, 3})));
  // all_gather: every block is this rank's.
  Tensor g = Tensor::zeros({8, 3}, DType::F32);
  c.all_gather(x, g, s);
  for (int b = 0; b < 4; ++b) EXPECT_TRUE(same(g.narrow(2 * b, 2), x)) << "block " << b;
  // reduce_scatter: this rank's block (rows 4..5); of counts, times the group's size.
  Tensor in = iota({8, 3}), out = Tensor::zeros({2, 3}, DType::F32);
  c.reduce_scatter(in, out, s);
  EXPECT_TRUE(same(out, in.narrow(4, 2)));
  Tensor counts = Tensor::from(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8}, {8});
  Tensor mine = Tensor::zeros({2}, DType::I32);
  c.reduce_scatter(counts, mine, s);
  EXPECT_EQ(mine.data<int32_t>()[0], 20);
  EXPECT_EQ(mine.data<int32_t>()[1], 24);
  // all_to_all: every block of out is the block this rank sends to itself (block 2).
  Tensor a2a = Tensor::zeros({8, 3}, DType::F32);
  c.all_to_all(in, a2a, s);
  for (int b = 0; b < 4; ++b) EXPECT_TRUE(same(a2a.narrow(2 * b, 2), in.narrow(4, 2)));
  // all_to_allv with the counts its all_to_all gives: 3 rows to itself, so 3 from everyone.
  Tensor rows_in = iota({7, 3});
  std::vector<int64_t> send{1, 2, 3, 1}, recv{3, 3, 3, 3};
  Tensor v = Tensor::empty({12, 3}, DType::F32);
  c.all_to_allv(rows_in, send, v, recv, s);
  for (int b = 0; b < 4; ++b) EXPECT_TRUE(same(v.narrow(3 * b, 3), rows_in.narrow(3, 3)));
  // A count that cannot come from this rank's data: zeros.
  std::vector<int64_t> odd{3, 3, 2, 4};
  c.all_to_allv(rows_in, send, v, odd, s);
  for (int64_t i = 6 * 3; i < 12 * 3; ++i) EXPECT_EQ(v.data<float>()[i], 0.f) << i;
  // recv: zeros; send and barrier: nothing; broadcast: unchanged.
  Tensor r = iota({2, 3});
  c.recv(r, 1, s);
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(r.data<float>()[i], 0.f);
  c.send(x, 3, s);
  c.broadcast(x, 0, s);
  c.barrier(s);
  EXPECT_TRUE(same(x, iota({2, 3})));
  EXPECT_EQ(c.stats().calls[int(OpKind::AllReduce)], 3u);
  EXPECT_EQ(c.stats().calls[int(OpKind::ReduceScatter)], 2u);
  EXPECT_EQ(c.stats().calls[int(OpKind::AllToAllV)], 2u);
}

TEST(FakeComm, WorldAndGroupsOfTheRankPlayed) {
  // Rank 5 of 8 at TP 2 x PP 2 x DP 2: its groups keep their real sizes and its places.
  const Env env = {{"WORLD_SIZE", "8"}, {"RANK", "5"}};
  LaunchInfo li = fake_launch(env_of(env));
  EXPECT_EQ(li.launcher, "fake");
  EXPECT_EQ(li.size, 8);
  EXPECT_EQ(li.rank, 5);
  EXPECT_EQ(li.local_rank, -1);
  EXPECT_EQ(fake_launch(env_of({{"WORLD_SIZE", "8"}, {"RANK", "5"}, {"LOCAL_RANK", "1"}}))
                .local_rank,
            1);
  auto w = make_fake_world(li, std::chrono::seconds(5));
  EXPECT_EQ(w->size(), 8);
  EXPECT_EQ(w->rank(), 5);
  EXPECT_EQ(w->backend(), "fake");
  parallel::ParallelSizes sizes;
  sizes.tp = 2, sizes.pp = 2;
  parallel::ParallelState ps(*w, sizes);
  EXPECT_EQ(ps.tp().size(), 2);
  EXPECT_EQ(ps.dp().size(), 2);
  EXPECT_EQ(ps.tp_rank(), 1);
  EXPECT_EQ(ps.pp_rank(), 1);
  EXPECT_EQ(ps.dp_rank(), 0);
  EXPECT_EQ(ps.tp().backend(), "fake");
  EXPECT_EQ(ps.tp().ranks(), (std::vector<int>{4, 5}));
}

TEST(FakeComm, LaunchErrorsNameTheVariable) {
  auto err = [](const Env& m) { return error_of([&] { fake_launch(env_of(m)); }); };
  EXPECT_NE(err({{"RANK", "0"}}).find("environment variable WORLD_SIZE is not set"),
            std::string::npos);
  EXPECT_NE(err({{"WORLD_SIZE", "8"}}).find("environment variable RANK is not set"),
            std::string::npos);
  EXPECT_NE(err({{"WORLD_SIZE", "8"}, {"RANK", "8"}}).find("RANK=8 is not below WORLD_SIZE=8"),
            std::string::npos);
  EXPECT_NE(err({{"WORLD_SIZE", "-2"}, {"RANK", "0"}}).find("WORLD_SIZE='-2' is not a"),
            std::string::npos);
  EXPECT_NE(err({{"WORLD_SIZE", "8"}, {"RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}})
                .find("launched with OMPI_COMM_WORLD_SIZE=2"),
            std::string::npos);
  // A launcher of one process is fine (mpirun -np 1).
  const Env one = {{"WORLD_SIZE", "8"}, {"RANK", "0"}, {"SLURM_STEP_NUM_TASKS", "1"}};
  EXPECT_EQ(fake_launch(env_of(one)).size, 8);
}
