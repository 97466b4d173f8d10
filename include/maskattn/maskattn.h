// maskattn: masked scaled-dot-product attention. The whole public API.
#pragma once

#include "maskattn/array.h"
#include "maskattn/attention.h"
#include "maskattn/audit.h"
#include "maskattn/dtype.h"
#include "maskattn/error.h"
#include "maskattn/gradcheck.h"
#include "maskattn/health.h"
#include "maskattn/heatmap.h"
#include "maskattn/mask.h"
#include "maskattn/mask_spec.h"
#include "maskattn/memory.h"
#include "maskattn/npy.h"
#include "maskattn/score_mods.h"
#include "maskattn/shape.h"
#include "maskattn/tensor.h"
#include "maskattn/tokens.h"
