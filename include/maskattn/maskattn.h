// maskattn: masked scaled-dot-product attention. The public API of the attention library
// (maskattn::maskattn). The other components have their own headers: heatmaps and plots
// (maskattn/heatmap.h, maskattn/plot.h: maskattn::viz), the tiny GPT (maskattn/model/*.h:
// maskattn::model) and the ring over MPI (maskattn/dist/ring_mpi.h: maskattn::distributed).
#pragma once

#include "maskattn/array.h"
#include "maskattn/attention.h"
#include "maskattn/audit.h"
#include "maskattn/dtype.h"
#include "maskattn/error.h"
#include "maskattn/gradcheck.h"
#include "maskattn/health.h"
#include "maskattn/kv_cache.h"
#include "maskattn/kv_format.h"
#include "maskattn/mask.h"
#include "maskattn/mask_spec.h"
#include "maskattn/memory.h"
#include "maskattn/multihead.h"
#include "maskattn/npy.h"
#include "maskattn/paged_kv_cache.h"
#include "maskattn/paged_tensors.h"
#include "maskattn/program.h"
#include "maskattn/score_mods.h"
#include "maskattn/shape.h"
#include "maskattn/sparse_layouts.h"
#include "maskattn/tensor.h"
#include "maskattn/tokens.h"
#include "maskattn/tree.h"
#include "maskattn/varlen.h"
