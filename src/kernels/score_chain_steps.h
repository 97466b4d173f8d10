// The order of the score-modifier chain, written once (docs/design.md §3; see score_chain.h).
//
// Deliberately without an include guard: it is included inside a namespace, once in
// maskattn::detail (score_chain.h, for the f64 arithmetic) and once per SIMD target inside that
// target's namespace (score_chain-inl.h, for the vector arithmetic). A vector arithmetic passes
// SIMD vectors by value, and a function compiled without the target's instruction set must not
// take or return them (the calling conventions differ), so the vector kernels get their own copy
// of this template, compiled for their target; the text, and so the order, stays one.

// The chain up to the score program's place (score_fn takes the same place; one of them at most).
// Tile arithmetics run the program on a whole tile between this and ApplyScoreChainTail.
template <class Arithmetic>
inline typename Arithmetic::Score ApplyScoreChainHead(const ResolvedMods& mods, bool additive,
                                                      Arithmetic& arithmetic,
                                                      typename Arithmetic::Score s) {
  if (mods.softcap) s = arithmetic.softcap(s);
  if (mods.alibi_slopes != nullptr) s = arithmetic.alibi(s);
  if (mods.bias != nullptr) s = arithmetic.bias(s);
  if (additive) s = arithmetic.additive(s);
  if (mods.score_fn != nullptr) s = arithmetic.score_fn(s);
  return s;
}

template <class Arithmetic>
inline typename Arithmetic::Score ApplyScoreChainTail(const ResolvedMods& mods,
                                                      Arithmetic& arithmetic,
                                                      typename Arithmetic::Score s) {
  if (mods.threshold) s = arithmetic.threshold(s);
  return s;
}

// The whole chain, one score at a time (the scalar arithmetics).
template <class Arithmetic>
inline typename Arithmetic::Score ApplyScoreChain(const ResolvedMods& mods, bool additive,
                                                  Arithmetic& arithmetic,
                                                  typename Arithmetic::Score s) {
  s = ApplyScoreChainHead(mods, additive, arithmetic, s);
  if (mods.program != nullptr) s = arithmetic.program(s);
  return ApplyScoreChainTail(mods, arithmetic, s);
}
