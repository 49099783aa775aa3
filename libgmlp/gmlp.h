/* gmlp.h: the libgmlp umbrella header
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#define GMLP_INSIDE
# include "gmlp-version.h"
# include "gmlp-version-macros.h"
# include "gmlp-enum-types.h"
# include "gmlp-error.h"
# include "gmlp-dtype.h"
# include "gmlp-device.h"
# include "gmlp-scaling-recipe.h"
# include "gmlp-grouped-tensor.h"
# include "gmlp-quantizer.h"
# include "gmlp-event.h"
# include "gmlp-graph.h"
# include "gmlp-saved-activations.h"
# include "gmlp-offload-context.h"
# include "gmlp-grouped-linear.h"
# include "gmlp-grouped-mlp.h"
# include "gmlp-routing.h"
# include "gmlp-router.h"
# include "gmlp-moe-layer.h"
# include "gmlp-communicator.h"
#undef GMLP_INSIDE
