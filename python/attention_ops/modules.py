"""MultiHeadAttention on the operator: the book's class (chapter 3), its parameters by the same
names (W_query, W_key, W_value, out_proj and the `mask` buffer), so that a state_dict moves
between it, the book's class and the C++ attention::MultiHeadAttention."""

import torch
from torch import nn

from .functional import scaled_dot_product_attention


class MultiHeadAttention(nn.Module):
    """The book's MultiHeadAttention with its attention on the library's operator.

    x (b, num_tokens, d_in) -> (b, num_tokens, d_out). num_kv_heads (default num_heads) groups
    the query heads over fewer key/value heads, as the C++ module's option of that name; causal
    False attends to every token. Dropout applies to the attention weights in training, as the
    book's does (the operator then computes the math backend's weights).

        torch.manual_seed(123)
        mha = MultiHeadAttention(d_in=768, d_out=768, context_length=1024, dropout=0.0,
                                 num_heads=12)
        y = mha(torch.randn(8, 1024, 768))
    """

    def __init__(self, d_in: int, d_out: int, context_length: int, dropout: float,
                 num_heads: int, qkv_bias: bool = False, num_kv_heads: int = -1,
                 causal: bool = True):
        super().__init__()
        if d_out % num_heads != 0:
            raise ValueError(f"MultiHeadAttention: d_out ({d_out}) must be divisible by "
                             f"num_heads ({num_heads})")
        if num_kv_heads < 0:
            num_kv_heads = num_heads
        if num_kv_heads < 1 or num_heads % num_kv_heads != 0:
            raise ValueError(f"MultiHeadAttention: num_heads ({num_heads}) must be a multiple "
                             f"of num_kv_heads ({num_kv_heads})")
        self.d_out = d_out
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = d_out // num_heads
        self.causal = causal
        self.dropout_p = dropout
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, num_kv_heads * self.head_dim, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, num_kv_heads * self.head_dim, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        # The book's causal mask, kept as a buffer so that its state_dict loads strictly; the
        # operator masks by position instead of reading it.
        self.register_buffer(
            "mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, num_tokens, _ = x.shape
        queries = self.W_query(x).view(b, num_tokens, self.num_heads, self.head_dim)
        keys = self.W_key(x).view(b, num_tokens, self.num_kv_heads, self.head_dim)
        values = self.W_value(x).view(b, num_tokens, self.num_kv_heads, self.head_dim)

        context = scaled_dot_product_attention(
            queries.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
            is_causal=self.causal, dropout_p=self.dropout_p if self.training else 0.0)
        context = context.transpose(1, 2).reshape(b, num_tokens, self.d_out)
        return self.out_proj(context)
