// maskattn info: the CPU, the features the kernels use, and the product unit each input dtype
// gets on it (include/maskattn/cpu.h), with what MASKATTN_PRODUCTS changes. Benchmarks print it
// beside their figures, so that a number always says which path made it.
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <cstdlib>

#include "commands.h"
#include "maskattn/cpu.h"

namespace maskattn::cli {

namespace {

const char* yes_no(bool value) {
  return value ? "yes" : "no";
}

int run_info() {
  const CpuReport cpu = cpu_report();
  fmt::print("cpu: {}\n", cpu.model);
  fmt::print("simd target: {} (f32 kernels, chosen at run time)\n", cpu.simd_target);
  fmt::print("avx512: {}  avx512-bf16: {}  avx512-fp16: {}  amx-bf16: {}", yes_no(cpu.avx512),
             yes_no(cpu.avx512_bf16), yes_no(cpu.avx512_fp16), yes_no(cpu.amx_bf16));
  if (cpu.amx_bf16) {
    fmt::print(" ({})", cpu.amx_permitted ? "tile state granted" : "tile state refused by Linux");
  }
  fmt::print("\n");
  if (!cpu.bf16_probe.empty()) fmt::print("bf16 probe: {}\n", cpu.bf16_probe);
  fmt::print("products f32={} f16={} bf16={}\n", products_name(cpu.f32), products_name(cpu.f16),
             products_name(cpu.bf16));
  const char* forced = std::getenv("MASKATTN_PRODUCTS");
  if (forced != nullptr && *forced != '\0') {
    // tile_products applies the variable and throws for a bad value: the same check as a call.
    fmt::print("MASKATTN_PRODUCTS={}: bf16 calls use {}\n", forced,
               products_name(tile_products(DType::bf16, 64, 64, true)));
  }
  return 0;
}

}  // namespace

Command add_info_command(CLI::App& app) {
  return {app.add_subcommand("info", "this CPU's features and the product unit per dtype"),
          [] { return run_info(); }};
}

}  // namespace maskattn::cli
