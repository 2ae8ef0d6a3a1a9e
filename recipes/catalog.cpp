// The one list of recipes and the one list of recipe sections (recipes/catalog.h).
#include "recipes/catalog.h"

#include "recipes/bert_objective.h"
#include "recipes/bert_pretrain.h"
#include "recipes/classify.h"
#include "recipes/distill.h"
#include "recipes/dpo.h"
#include "recipes/finetune.h"
#include "recipes/gpt_pretrain.h"
#include "recipes/grpo.h"
#include "recipes/ppo.h"
#include "recipes/preference_config.h"
#include "recipes/reward_model.h"
#include "runtime/lora_config.h"

namespace forge {

Catalog forge_catalog() {
  Catalog catalog;
  catalog.recipes = {
      gpt_pretrain_recipe(),
      bert_pretrain_recipe(),
      finetune_recipe(),
      distill_recipe(),
      classify_recipe(),
      reward_model_recipe(),
      dpo_recipe(),
      ppo_recipe(),
      grpo_recipe(),
  };
  catalog.sections = {
      bert_section(),
      lora_section(),
      finetune_section(),
      distill_section(),
      classify_section(),
      preference_section(),
      reward_model_section(),
      dpo_section(),
      ppo_section(),
      grpo_section(),
  };
  return catalog;
}

}  // namespace forge
