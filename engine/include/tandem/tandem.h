// Tandem: the embeddable library in one include.
#pragma once

#include "tandem/cluster.h"
#include "tandem/config.h"
#include "tandem/dataset.h"
#include "tandem/error.h"
#include "tandem/model.h"
#include "tandem/trainer.h"
#include "tandem/version.h"
