// Mask and modifier SPEC strings, as the CLI's --mask and --mod take them (docs/cli.md lists them
// all). Mask SPECs:
//   causal  causal:top-left  window:LEFT:RIGHT  sliding-window:W  chunk:C  prefix:P
//   key-lengths:FILE  key-starts:FILE  key-keep:FILE  key-blocked:FILE  pad-id:ID:FILE
//   query-lengths:FILE  query-starts:FILE  query-keep:FILE  query-pad-id:ID:FILE
//   segments:FILE  segments:QFILE:KFILE  spans:FILE  spans:QFILE:KFILE
//   global:FILE  global:QFILE:KFILE  block-sparse:BQ:BK:FILE
//   keep:FILE  blocked:FILE  additive:FILE  expr:PROGRAM[:NAME=FILE]...
//   tree:P0,P1,...  tree:FILE (parents of a draft tree: [T] or [B,T] integers, -1 = a root)
// Modifier SPECs:
//   alibi:FILE  softcap:X  sinks:FILE  threshold:X  bias:FILE  expr:PROGRAM[:NAME=FILE]...
// An expr: SPEC is a program (maskattn/program.h) whose tables are .npy files: a mask program
// where a mask SPEC is expected, a score program (ScoreMods::program) where a modifier is. The
// program text holds no ':', so the SPEC splits at every ':'.
// FILE is a .npy file. Shared by the CLI, the tools and (later) the Python package.
#pragma once

#include <string>

#include "maskattn/mask.h"
#include "maskattn/score_mods.h"

namespace maskattn {

struct SpecOptions {
  // The inputs are [B, L, D] (one head): a 3-D keep/blocked/additive/bias file is then [B, Lq, Lk]
  // and gets a head axis ([B, 1, Lq, Lk]) instead of NumPy's alignment of its first axis with Hq;
  // a 3-D block-sparse layout likewise is [B, nQ, nK], not [H, nQ, nK].
  bool one_head_layout = false;
};

// Parses one mask SPEC and adds the component to `mask` (labelled with `label`); an expr: SPEC is
// a mask program. The modifier SPECs other than expr: (alibi, softcap, sinks, threshold, bias) are
// accepted too and go to `mods`, as --mask has always taken them. Errors start with `label`; by
// default "mask spec '<spec>'".
void apply_mask_spec(const std::string& spec, Mask& mask, ScoreMods& mods,
                     const std::string& label = "", const SpecOptions& options = {});

// Parses one modifier SPEC into `mods`; an expr: SPEC is a score program. A mask SPEC is an error
// that says so. Errors start with `label`; by default "modifier spec '<spec>'".
void apply_mod_spec(const std::string& spec, ScoreMods& mods, const std::string& label = "",
                    const SpecOptions& options = {});

// One line per SPEC form with its meaning, for --help texts.
const char* mask_spec_help();

}  // namespace maskattn
