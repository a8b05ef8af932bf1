// `shortconv check`: the exactness suite, in fp32.
//
// Each case runs a batch whole and cut in two per sequence (head + tail, the
// head's final state handed to the tail as its initial state), with the loss
// on tail outputs only.  The gradient at the W-1 head positions that carry it
// is, for the whole run, du at those positions (dx of the last W-1 head
// tokens, or dh0 where the head is shorter), and for the chunked run the
// tail's dh0; ratio = ||chunked|| / ||whole|| must be 1 (within 1e-4), and the
// elementwise error too.  The forward must be bit-identical (every y and the
// final state).  The head's backward fed the tail's dh0 must reproduce the
// whole dx / dh0, and head + tail dweight / dbias the whole ones.  Separately,
// the whole batch with the loss on every output is compared to the float64
// oracle (y, final state, dx, dweight, dbias, dh0).
//
// Cases: W in {2,4,8} x tail lengths 16..384 (automatic tiles); every forced
// time tile from 1 to past W (including splits inside the first W-1 tokens);
// packed short segments (lengths in [1,7] with W=4; lengths 0..W+1 per W).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "cli.hpp"
#include "harness/harness.hpp"

namespace shortconv::cli {

namespace {

using harness::Case;
using harness::ChunkResult;

constexpr double kRatioTol = 1e-4;  // the acceptance: |ratio - 1| <= 1e-4 in fp32
constexpr double kFp32Tol = 1e-5;   // ||out-ref||/||ref|| for fp32 outputs

struct Row {
  std::string kind;  // "chunk" | "tile" | "packed"
  int W = 0;
  int64_t head = 0, tail = 0, tile = 0;
  std::string segs;  // packed: the segment lengths, summarised
  ChunkResult r;
  double err_y = 0, err_dx = 0, err_dw = 0, err_db = 0, err_dh0 = 0;
  bool ok = false;
  std::string why;
};

void usage(FILE* f) {
  std::fprintf(f,
               "usage: shortconv check [--backend %s] [--json] [--seed N] [--verbose]\n"
               "\n"
               "The exactness suite (fp32).  For W in {2,4,8} and tail lengths 16..384, runs the\n"
               "whole sequence and head + tail with the head's final state handed to the tail as\n"
               "its initial state, loss on tail outputs only, and reports\n"
               "  ratio      ||grad chunked|| / ||grad whole|| at the W-1 head positions that carry\n"
               "             the gradient (1.0000 is correct; must be within 1e-4 of 1)\n"
               "  grad_err   elementwise ||chunked - whole|| / ||whole|| of that gradient\n"
               "  fwd        whether the forward (y and final state) is bit-identical\n"
               "  chain      head backward fed the tail's dh0 vs the whole dx/dh0/dweight/dbias\n"
               "  y dx dweight dbias dh0  ||out - oracle|| / ||oracle|| of the whole batch with\n"
               "             the loss on every output (<= 1e-5)\n"
               "The same for every forced time tile from 1 to past W, and for packed short\n"
               "segments (lengths [1,7] with W=4; lengths 0..W+1).\n"
               "\n"
               "options:\n"
               "  --backend B   backend to check: %s (default %s)\n"
               "  --json        print one JSON object {ok, backend, cases: [{W, tail, tile, ratio,\n"
               "                forward_bitexact, ...}]} instead of the table\n"
               "  --seed N      seed of the random inputs (default 1)\n"
               "  --verbose     print why each failing case failed\n"
               "Exit status: 0 when every case passes, 1 on any failure, 2 on bad usage.\n",
               backend_names("|", "|").c_str(), backend_names(", ", " or ").c_str(),
               sc_backend_name(SC_BACKEND_CPU));
}

// Runs one chunked case on `backend` and the oracle; fills the row.
void run_case(Row& row, const Case& c, const harness::Inputs& in, const std::vector<int64_t>& split,
              sc_backend backend) {
  row.r = harness::run_chunked(c, in, split, backend);
  const ChunkResult ref = harness::run_chunked(c, in, split, SC_BACKEND_REF);
  std::string why;
  if (row.r.status != SC_OK || !row.r.error.empty()) why += row.r.error;
  if (ref.status != SC_OK) why += "oracle: " + ref.error;
  // Against the oracle: the whole batch with the loss on every output (random
  // dy everywhere, so dx and dh0 are non-trivial on head tokens too).
  Case full = c;
  full.ht = full.want_dh0 = full.want_dx = full.want_dweight = full.want_dbias = true;
  const harness::Outputs got = harness::run(full, in, backend);
  const harness::Outputs oracle = harness::run(full, in, SC_BACKEND_REF);
  if (!got.ok()) why += got.problems();
  if (!oracle.ok()) why += "oracle: " + oracle.problems();
  if (why.empty()) {
    row.err_y = harness::rel_err(got.y, oracle.y);
    row.err_dx = harness::rel_err(got.dx, oracle.dx);
    row.err_dw = harness::rel_err(got.dweight, oracle.dweight);
    row.err_db = harness::rel_err(got.dbias, oracle.dbias);
    row.err_dh0 = harness::rel_err(got.dh0, oracle.dh0);
    const double ht_err = harness::rel_err(got.ht, oracle.ht);
    char b[160];
    auto bad = [&](const char* what, double v, double tol) {
      if (!(v <= tol)) {
        std::snprintf(b, sizeof b, "%s %.3g > %.0e; ", what, v, tol);
        why += b;
      }
    };
    bad("|ratio-1|", std::fabs(row.r.ratio - 1.0), kRatioTol);
    bad("grad_err", row.r.grad_err, kRatioTol);
    if (!row.r.forward_bitexact) why += "forward not bit-identical; ";
    if (!row.r.state_bitexact) why += "final state not bit-identical; ";
    bad("chain dx", row.r.dx_err, kFp32Tol);
    bad("chain dweight", row.r.dweight_err, kFp32Tol);
    bad("chain dbias", row.r.dbias_err, kFp32Tol);
    bad("chain dh0", row.r.dh0_err, kFp32Tol);
    bad("y vs oracle", row.err_y, kFp32Tol);
    bad("final_state vs oracle", ht_err, kFp32Tol);
    bad("dx vs oracle", row.err_dx, kFp32Tol);
    bad("dweight vs oracle", row.err_dw, kFp32Tol);
    bad("dbias vs oracle", row.err_db, kFp32Tol);
    bad("dh0 vs oracle", row.err_dh0, kFp32Tol);
    // the oracle itself must be exact under chunking (a harness self-check)
    if (!ref.forward_bitexact || std::fabs(ref.ratio - 1.0) > 1e-12) why += "oracle chunking inexact; ";
  }
  row.ok = why.empty();
  row.why = why;
}

Case base_case(int W, uint64_t seed) {
  Case c;
  c.W = W;
  c.act = SC_ACT_SILU;
  c.act_dtype = c.param_dtype = c.state_dtype = SC_F32;
  c.D = 40;  // not a multiple of any vector width: channel tails get exercised
  c.bias = true;
  c.h0 = true;  // a random initial state, so dh0 is non-trivial
  c.seed = seed;
  return c;
}

std::string summarize(const std::vector<int64_t>& len) {
  int64_t lo = len.empty() ? 0 : len[0], hi = lo, tot = 0;
  for (int64_t l : len) {
    lo = std::min(lo, l);
    hi = std::max(hi, l);
    tot += l;
  }
  return std::to_string(len.size()) + " segs len " + std::to_string(lo) + ".." +
         std::to_string(hi);
}

// ---- the cases ----------------------------------------------------------------------

// 1. W x tail length, automatic tiles; B = 2, head 37 tokens.
void chunk_rows(sc_backend backend, uint64_t* case_seed, std::vector<Row>* rows) {
  for (int W : {2, 4, 8})
    for (int64_t tail : {16, 32, 64, 128, 256, 384}) {
      Row row;
      row.kind = "chunk";
      row.W = W;
      row.head = 37;
      row.tail = tail;
      Case c = base_case(W, ++*case_seed);
      c.B = 2;
      c.T = row.head + tail;
      const harness::Inputs in = harness::make_inputs(c);
      run_case(row, c, in, std::vector<int64_t>(size_t(c.B), row.head), backend);
      rows->push_back(row);
    }
}

// 2. Every forced time tile from 1 to past W; heads of 1, W-1 (inside the
//    first W-1 tokens) and 37 tokens; tail 64.
void tile_rows(sc_backend backend, uint64_t* case_seed, std::vector<Row>* rows) {
  for (int W : {2, 4, 8})
    for (int64_t tile = 1; tile <= W + 2; ++tile)
      for (int64_t head : W == 2 ? std::vector<int64_t>{1, 37} : std::vector<int64_t>{1, W - 1, 37}) {
        Row row;
        row.kind = "tile";
        row.W = W;
        row.head = head;
        row.tail = 64;
        row.tile = tile;
        Case c = base_case(W, ++*case_seed);
        c.B = 2;
        c.T = head + row.tail;
        c.tile_t = tile;
        const harness::Inputs in = harness::make_inputs(c);
        run_case(row, c, in, std::vector<int64_t>(size_t(c.B), head), backend);
        rows->push_back(row);
      }
}

// 3. Packed short segments: lengths in [1,7] with W=4 (automatic tile and
//    forced tiles 1..5), and lengths 0..W+1 for each W; random cut points.
void packed_rows(sc_backend backend, uint64_t* case_seed, std::mt19937_64& rng,
                 std::vector<Row>* rows) {
  auto packed_row = [&](int W, std::vector<int64_t> len, int64_t tile) {
    Row row;
    row.kind = "packed";
    row.W = W;
    row.tile = tile;
    row.segs = summarize(len);
    Case c = base_case(W, ++*case_seed);
    c.packed = true;
    c.lengths = len;
    c.tile_t = tile;
    std::vector<int64_t> split(len.size());
    for (size_t i = 0; i < len.size(); ++i) {
      split[i] = int64_t(rng() % uint64_t(len[i] + 1));
      row.head += split[i];
      row.tail += len[i] - split[i];
    }
    const harness::Inputs in = harness::make_inputs(c);
    run_case(row, c, in, split, backend);
    rows->push_back(row);
  };
  for (int64_t tile : {0, 1, 2, 3, 4, 5}) {
    std::vector<int64_t> len(48);
    for (auto& l : len) l = 1 + int64_t(rng() % 7);
    packed_row(4, len, tile);
  }
  for (int W : {2, 4, 8})
    for (int64_t tile : {int64_t(0), int64_t(1), int64_t(W - 1 > 0 ? W - 1 : 1)}) {
      std::vector<int64_t> len;
      for (int rep = 0; rep < 2; ++rep)
        for (int64_t l = 0; l <= W + 1; ++l) len.push_back(l);
      std::shuffle(len.begin(), len.end(), rng);
      packed_row(W, len, tile);
    }
}

// ---- the report ---------------------------------------------------------------------

struct Summary {
  bool all_ok = true;
  int failed = 0;
  double worst_ratio = 0;
  double max_err[5] = {0, 0, 0, 0, 0};  // y, dx, dweight, dbias, dh0 vs the oracle
};

Summary summarize_rows(const std::vector<Row>& rows) {
  Summary s;
  for (const Row& r : rows) {
    s.all_ok = s.all_ok && r.ok;
    s.failed += !r.ok;
    s.worst_ratio = std::max(s.worst_ratio, std::fabs(r.r.ratio - 1.0));
    const double e[5] = {r.err_y, r.err_dx, r.err_dw, r.err_db, r.err_dh0};
    for (int k = 0; k < 5; ++k) s.max_err[k] = std::max(s.max_err[k], e[k]);
  }
  return s;
}

void print_json(const std::vector<Row>& rows, const Summary& s, const std::string& bname) {
  std::printf("{\"ok\": %s, \"backend\": %s, \"dtype\": \"float32\", \"ratio_tol\": %s, "
              "\"worst_ratio_dev\": %s, \"max_err\": {\"y\": %s, \"dx\": %s, \"dweight\": %s, "
              "\"dbias\": %s, \"dh0\": %s}, \"cases\": [",
              s.all_ok ? "true" : "false", json_str(bname).c_str(), json_num(kRatioTol).c_str(),
              json_num(s.worst_ratio).c_str(), json_num(s.max_err[0]).c_str(),
              json_num(s.max_err[1]).c_str(), json_num(s.max_err[2]).c_str(),
              json_num(s.max_err[3]).c_str(), json_num(s.max_err[4]).c_str());
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::printf("%s\n  {\"kind\": %s, \"W\": %d, \"head\": %lld, \"tail\": %lld, \"tile\": %lld, "
                "\"segments\": %s, \"ratio\": %s, \"grad_err\": %s, \"forward_bitexact\": %s, "
                "\"state_bitexact\": %s, \"chain_dx_err\": %s, \"chain_dweight_err\": %s, "
                "\"err_y\": %s, \"err_dx\": %s, \"err_dweight\": %s, \"err_dbias\": %s, "
                "\"err_dh0\": %s, \"ok\": %s, \"error\": %s}",
                i ? "," : "", json_str(r.kind).c_str(), r.W, (long long)r.head,
                (long long)r.tail, (long long)r.tile, json_str(r.segs).c_str(),
                json_num(r.r.ratio).c_str(), json_num(r.r.grad_err).c_str(),
                r.r.forward_bitexact ? "true" : "false", r.r.state_bitexact ? "true" : "false",
                json_num(r.r.dx_err).c_str(), json_num(r.r.dweight_err).c_str(),
                json_num(r.err_y).c_str(), json_num(r.err_dx).c_str(),
                json_num(r.err_dw).c_str(), json_num(r.err_db).c_str(),
                json_num(r.err_dh0).c_str(), r.ok ? "true" : "false", json_str(r.why).c_str());
  }
  std::printf("\n]}\n");
}

void print_table(const std::vector<Row>& rows, const Summary& s, const std::string& bname,
                 bool verbose) {
  std::printf("shortconv check — backend %s, fp32, SiLU, bias, random h0, D=40, B=2 "
              "(packed: segments), loss on tail outputs only\n",
              bname.c_str());
  std::printf("ratio = ||grad chunked|| / ||grad whole|| at the W-1 head positions "
              "(1.0000 is correct, tolerance 1e-4)\n");
  std::printf("tile 0 = automatic; errors vs the float64 oracle as ||out-ref||/||ref||\n\n");
  std::printf("%-6s %2s %5s %5s %4s %-18s %8s %9s %5s %9s %9s %9s %9s %9s %9s  %s\n", "kind", "W",
              "head", "tail", "tile", "segments", "ratio", "grad_err", "fwd", "chain", "y", "dx",
              "dweight", "dbias", "dh0", "");
  for (const Row& r : rows) {
    const double chain = std::max({r.r.dx_err, r.r.dweight_err, r.r.dbias_err, r.r.dh0_err});
    std::printf("%-6s %2d %5lld %5lld %4lld %-18s %8.4f %9.2e %5s %9.2e %9.2e %9.2e %9.2e %9.2e "
                "%9.2e  %s\n",
                r.kind.c_str(), r.W, (long long)r.head, (long long)r.tail, (long long)r.tile,
                r.segs.empty() ? "-" : r.segs.c_str(), r.r.ratio, r.r.grad_err,
                r.r.forward_bitexact && r.r.state_bitexact ? "exact" : "DIFF", chain, r.err_y,
                r.err_dx, r.err_dw, r.err_db, r.err_dh0, r.ok ? "ok" : "FAIL");
    if (!r.ok && verbose) std::printf("       -> %s\n", r.why.c_str());
  }
  std::printf("\nmax rel error vs the oracle: y %.2e  dx %.2e  dweight %.2e  dbias %.2e  dh0 %.2e "
              "(tolerance %.0e)\n",
              s.max_err[0], s.max_err[1], s.max_err[2], s.max_err[3], s.max_err[4], kFp32Tol);
  std::printf("%zu cases, %d failed; worst |ratio - 1| = %.2e; %s\n", rows.size(), s.failed,
              s.worst_ratio, s.all_ok ? "OK" : "FAILED");
  if (!s.all_ok && !verbose)
    for (const Row& r : rows)
      if (!r.ok) {
        std::printf("first failure (W=%d head=%lld tail=%lld tile=%lld): %s\n", r.W,
                    (long long)r.head, (long long)r.tail, (long long)r.tile, r.why.c_str());
        break;
      }
}

}  // namespace

int check_main(int argc, char** argv) {
  Options opt;
  opt.flags = {"--json", "--help", "-h", "--verbose"};
  opt.valued = {"--backend", "--seed"};
  if (int rc = parse_command_line(opt, argc, argv, "check", usage); rc >= 0) return rc;
  sc_backend backend;
  std::string bname;
  if (int rc = backend_option(opt, "check", &backend, &bname); rc >= 0) return rc;
  int64_t seed = 1;
  if (opt.has("--seed") && !parse_int(opt.get("--seed", ""), &seed)) {
    std::fprintf(stderr, "shortconv check: --seed: expected a non-negative integer, got '%s'\n",
                 opt.get("--seed", "").c_str());
    return 2;
  }
  if (int rc = require_backend(backend, bname, "check"); rc >= 0) return rc;

  std::vector<Row> rows;
  std::mt19937_64 rng(uint64_t(seed) * 7919 + 1);
  uint64_t case_seed = uint64_t(seed) * 1000;
  chunk_rows(backend, &case_seed, &rows);
  tile_rows(backend, &case_seed, &rows);
  packed_rows(backend, &case_seed, rng, &rows);

  const Summary s = summarize_rows(rows);
  if (opt.has("--json"))
    print_json(rows, s, bname);
  else
    print_table(rows, s, bname, opt.has("--verbose"));
  return s.all_ok ? 0 : 1;
}

}  // namespace shortconv::cli
