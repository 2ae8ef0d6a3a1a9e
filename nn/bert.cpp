// BERT: embeddings summed and normalised, encoder blocks over the key-padding mask (which goes to
// the fused attention kernel untouched), pooler, and the MLM and NSP heads. Each layer is
// initialised as it is built, in parameter order.
#include "nn/bert.h"

#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"

namespace forge::nn {
namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw Error(ExitCode::usage, "model config: " + message);
}

std::shared_ptr<Linear> make_linear(const BertConfig& c, int64_t in, int64_t out, Generator& gen) {
  return std::make_shared<Linear>(in, out, /*bias=*/true, gen, c.init_std);
}

}  // namespace

void check_config(const BertConfig& c) {
  auto str = [](auto v) { return std::to_string(v); };
  require(c.vocab_size > 0, "vocab_size must be positive, got " + str(c.vocab_size));
  require(c.max_positions > 0, "max_positions must be positive, got " + str(c.max_positions));
  require(c.type_vocab_size > 0,
          "type_vocab_size must be positive, got " + str(c.type_vocab_size));
  require(c.n_layers > 0, "n_layers must be positive, got " + str(c.n_layers));
  require(c.n_heads > 0, "n_heads must be positive, got " + str(c.n_heads));
  require(c.d_model > 0 && c.d_model % c.n_heads == 0,
          "d_model " + str(c.d_model) + " must be a positive multiple of n_heads " + str(c.n_heads));
  require(c.d_ff > 0, "d_ff must be positive, got " + str(c.d_ff));
  require(c.dropout >= 0.0 && c.dropout < 1.0, "dropout must be in [0, 1), got " + str(c.dropout));
  require(c.norm_eps > 0.0, "norm_eps must be positive, got " + str(c.norm_eps));
  require(c.init_std > 0.0, "init_std must be positive, got " + str(c.init_std));
  require(c.pad_id >= -1 && c.pad_id < c.vocab_size,
          "pad_id must be -1 (none) or a token id below vocab_size " + str(c.vocab_size) +
              ", got " + str(c.pad_id));
}

int64_t bert_num_parameters(const BertConfig& c) {
  const int64_t C = c.d_model, V = c.vocab_size, F = c.d_ff;
  const int64_t ln = 2 * C, linear_cc = C * C + C;
  const int64_t embeddings = (V + c.max_positions + c.type_vocab_size) * C + ln;
  const int64_t block = 3 * linear_cc + linear_cc + ln + (C * F + F) + (F * C + C) + ln;
  const int64_t heads = linear_cc /*pooler*/ + linear_cc + ln + V /*mlm*/ + 2 * C + 2 /*nsp*/;
  return embeddings + c.n_layers * block + (c.pre_norm ? ln : 0) + heads;
}

BertFeedForward::BertFeedForward(const BertConfig& c, Generator& gen) {
  register_module("fc", make_linear(c, c.d_model, c.d_ff, gen), fc);
  register_module("proj", make_linear(c, c.d_ff, c.d_model, gen), proj);
  drop = register_module("drop", std::make_shared<Dropout>(c.dropout));
}

// x [..., C] -> [..., C]
Tensor BertFeedForward::forward(const Tensor& x) const {
  return drop->forward(proj->forward(gelu(fc->forward(x))));
}

BertBlock::BertBlock(const BertConfig& c, Generator& gen) : pre_norm_(c.pre_norm) {
  AttentionConfig a;
  a.d_model = c.d_model;
  a.n_heads = c.n_heads;
  a.context = c.max_positions;
  a.causal = false;
  a.dropout = c.dropout;
  a.init_std = c.init_std;
  a.proj_init_std = c.init_std;
  attn = register_module("attn", std::make_shared<SelfAttention>(a, gen));
  register_module("ln1", std::make_shared<LayerNorm>(c.d_model, c.norm_eps), ln1);
  register_module("ff", std::make_shared<BertFeedForward>(c, gen), ff);
  register_module("ln2", std::make_shared<LayerNorm>(c.d_model, c.norm_eps), ln2);
}

// x [B, T, C], attention_mask [B, T] -> [B, T, C]
Tensor BertBlock::forward(const Tensor& x, const Tensor& attention_mask) const {
  if (pre_norm_) {
    Tensor h = x + attn->forward(ln1->forward(x), attention_mask);
    return h + ff->forward(ln2->forward(h));
  }
  Tensor h = ln1->forward(x + attn->forward(x, attention_mask));
  return ln2->forward(h + ff->forward(h));
}

BertMLMHead::BertMLMHead(const BertConfig& c, Generator& gen) {
  register_module("dense", make_linear(c, c.d_model, c.d_model, gen), dense);
  register_module("ln", std::make_shared<LayerNorm>(c.d_model, c.norm_eps), ln);
  bias = register_parameter("bias", zeros({c.vocab_size}));
}

// hidden_rows [..., C], decoder_weight [V, C] -> [..., V]
Tensor BertMLMHead::forward(const Tensor& hidden_rows, const Tensor& decoder_weight) const {
  return linear(ln->forward(gelu(dense->forward(hidden_rows))), decoder_weight, bias);
}

Bert::Bert(const BertConfig& c, Generator& gen) : config_(c) {
  check_config(c);
  const int64_t C = c.d_model;
  tok_emb = register_module("tok_emb", std::make_shared<Embedding>(c.vocab_size, C, gen, c.init_std));
  pos_emb =
      register_module("pos_emb", std::make_shared<Embedding>(c.max_positions, C, gen, c.init_std));
  seg_emb =
      register_module("seg_emb", std::make_shared<Embedding>(c.type_vocab_size, C, gen, c.init_std));
  if (c.pad_id >= 0) {
    NoGradGuard no_grad;
    slice(tok_emb->weight, 0, c.pad_id, c.pad_id + 1).copy_(zeros({1, C}));
  }
  emb_ln = register_module("emb_ln", std::make_shared<LayerNorm>(C, c.norm_eps));
  emb_drop = register_module("emb_drop", std::make_shared<Dropout>(c.dropout));
  blocks = register_module("blocks", std::make_shared<ModuleList<BertBlock>>());
  for (int64_t l = 0; l < c.n_layers; ++l) blocks->push_back(std::make_shared<BertBlock>(c, gen));
  if (c.pre_norm) ln_f = register_module("ln_f", std::make_shared<LayerNorm>(C, c.norm_eps));
  register_module("pooler", make_linear(c, C, C, gen), pooler);
  mlm = register_module("mlm", std::make_shared<BertMLMHead>(c, gen));
  register_module("nsp", make_linear(c, C, 2, gen), nsp);
}

// ids, segments, attention_mask [B, T] -> hidden [B, T, C], pooled [B, C]
BertOutputs Bert::forward(const Tensor& ids, const Tensor& segments,
                          const Tensor& attention_mask) const {
  FORGE_CHECK(ids.dim() == 2 && ids.dtype() == DType::i64 && ids.size(1) > 0,
              "BERT: ids must be a non-empty [B, T] i64 tensor, got ", shape_str(ids.shape()), " ",
              dtype_name(ids.dtype()));
  const int64_t B = ids.size(0), T = ids.size(1), C = config_.d_model;
  if (T > config_.max_positions)
    throw Error(ExitCode::usage, detail::concat("BERT: sequence length ", T,
                                                " exceeds max_positions ", config_.max_positions));
  FORGE_CHECK(!segments.defined() ||
                  (segments.shape() == ids.shape() && segments.dtype() == DType::i64),
              "BERT: segments must be i64 shaped like ids ", shape_str(ids.shape()), ", got ",
              segments.defined() ? shape_str(segments.shape()) : "", " ",
              segments.defined() ? dtype_name(segments.dtype()) : "");
  FORGE_CHECK(!attention_mask.defined() || attention_mask.shape() == ids.shape(),
              "BERT: attention_mask must be shaped like ids ", shape_str(ids.shape()), ", got ",
              attention_mask.defined() ? shape_str(attention_mask.shape()) : "");

  // [B, T, C] + [T, C] + ([B, T, C] or the [1, C] row of segment 0), broadcasting.
  Tensor x = embedding(tok_emb->weight, ids, config_.pad_id) +
             widened(slice(pos_emb->weight, 0, 0, T));
  x = x + (segments.defined() ? seg_emb->forward(segments)
                              : widened(slice(seg_emb->weight, 0, 0, 1)));
  x = emb_drop->forward(emb_ln->forward(x));
  for (const std::shared_ptr<BertBlock>& block : *blocks) {
    if (checkpointing_ && grad_enabled()) {
      x = checkpoint(
          [block, attention_mask](const std::vector<Tensor>& in) {
            return block->forward(in[0], attention_mask);
          },
          {x});
    } else {
      x = block->forward(x, attention_mask);
    }
  }
  if (ln_f) x = ln_f->forward(x);
  Tensor first = reshape(slice(x, 1, 0, 1), {B, C});  // [B, C]: each sequence's [CLS]
  return {x, tanh(pooler->forward(first))};
}

Tensor Bert::mlm_logits(const Tensor& hidden_rows) const {
  FORGE_CHECK(hidden_rows.dim() >= 1 && hidden_rows.size(-1) == config_.d_model,
              "BERT: MLM head needs rows [..., ", config_.d_model, "], got ",
              shape_str(hidden_rows.shape()));
  return mlm->forward(hidden_rows, tok_emb->weight);
}

Tensor Bert::nsp_logits(const Tensor& pooled) const {
  FORGE_CHECK(pooled.dim() == 2 && pooled.size(1) == config_.d_model,
              "BERT: NSP head needs pooled [B, ", config_.d_model, "], got ",
              shape_str(pooled.shape()));
  return nsp->forward(pooled);
}

}  // namespace forge::nn
