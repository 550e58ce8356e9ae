"""RGCN, RGAT, HGT, GAT, AGNN and TransformerConv written in the DSL (DESIGN.md section 3).  Weight names and slice
layouts are PyG's, so ``hector.nn`` layers feed PyG-shaped parameters straight in."""
import math


def rgcn(m, in_dim, out_dim, num_bases=None, num_blocks=None, aggr="mean", root_weight=True,
         bias=True):
    x = m.node_input("x", in_dim)
    if num_bases:
        W = m.basis(m.weight("comp", (num_bases,), per="relation"),
                    m.weight("weight", (num_bases, in_dim, out_dim)))
    elif num_blocks:
        W = m.blockdiag(m.weight("weight", (num_blocks, in_dim // num_blocks,
                                            out_dim // num_blocks), per="relation"))
    else:
        W = m.weight("weight", (in_dim, out_dim), per="relation")
    out = m.aggregate(m.linear(m.src(x), W), {"add": "sum"}.get(aggr, aggr), per_relation=True)
    if root_weight:
        out = out + m.linear(x, m.weight("root", (in_dim, out_dim)))
    return out + m.weight("bias", (out_dim,), init="zeros") if bias else out


def rgat(m, in_dim, out_dim, heads=1, negative_slope=0.2, concat=True, bias=True,
         num_bases=None, num_blocks=None):
    x = m.node_input("x", in_dim)
    if num_bases:
        W = m.basis(m.weight("att", (num_bases,), per="relation"),
                    m.weight("basis", (num_bases, in_dim, heads * out_dim)))
    elif num_blocks:
        W = m.blockdiag(m.weight("weight", (num_blocks, in_dim // num_blocks,
                                            heads * out_dim // num_blocks), per="relation"))
    else:
        W = m.weight("weight", (in_dim, heads * out_dim), per="relation")
    z_src = m.linear(m.src(x), W, heads=heads)          # x_u W_r
    z_dst = m.linear(m.dst(x), W, heads=heads)          # x_v W_r
    q, k = m.weight("q", (heads * out_dim, heads)), m.weight("k", (heads * out_dim, heads))
    score = m.linear(z_dst, q, heads=heads) + m.linear(z_src, k, heads=heads)
    alpha = m.edge_softmax(m.leaky_relu(score, negative_slope))
    out = m.aggregate(alpha * z_src, "sum")
    out = m.heads(out, 1) if concat else m.head_mean(out)
    width = heads * out_dim if concat else out_dim
    return out + m.weight("bias", (width,), init="zeros") if bias else out


def hgt(m, in_dim, out_dim, heads=1):
    d = out_dim // heads
    x = m.node_input("x", in_dim)

    def typed(name):   # per-node-type linear + bias: K_tau x, Q_tau x, V_tau x
        return m.heads(m.linear(x, m.weight(name, (in_dim, out_dim), per="node_type"))
                       + m.weight(name + "_bias", (out_dim,), per="node_type"), heads)
    k, q, v = typed("k"), typed("q"), typed("v")
    k_r = m.linear(m.src(k), m.weight("k_rel", (heads, d, d), per="relation"))
    v_r = m.linear(m.src(v), m.weight("v_rel", (heads, d, d), per="relation"))
    score = m.dot(m.dst(q), k_r) * m.weight("p_rel", (heads, 1), per="relation", init="ones")
    alpha = m.edge_softmax(score / math.sqrt(d))
    agg = m.heads(m.aggregate(alpha * v_r, "sum"), 1)
    out = (m.linear(m.gelu(agg), m.weight("a", (out_dim, out_dim), per="node_type"))
           + m.weight("a_bias", (out_dim,), per="node_type"))
    if in_dim != out_dim:
        return out
    gate = m.sigmoid(m.weight("skip", (1,), per="node_type", init="ones"))
    return x + gate * (out - x)                          # = g * out + (1 - g) * x


def gat(m, in_dim, out_dim, heads=1, negative_slope=0.2, concat=True, bias=True, dropout=0.0,
        residual=False):
    """PyG ``GATConv`` on a graph whose self loops the caller arranged; ``lin`` and ``res``
    are stored as PyG's ``nn.Linear`` weights, ``[out, in]``; the attention vectors are
    per-head ``(C, 1)`` weights (PyG's ``att_src [1, H, C]`` viewed ``[H, C, 1]``);
    ``dropout`` on the attention weights in training calls; ``residual``: plus ``x W_res``
    (PyG's ``res``, no bias), before the bias."""
    x = m.node_input("x", in_dim)
    z = m.linear(x, m.weight("lin", (in_dim, heads * out_dim), stored="transposed"),
                 heads=heads)                                                  # Theta x
    a_src = m.linear(z, m.weight("att_src", (heads, out_dim, 1)))             # <a_s, z_h>
    a_dst = m.linear(z, m.weight("att_dst", (heads, out_dim, 1)))
    alpha = m.edge_softmax(m.leaky_relu(m.src(a_src) + m.dst(a_dst), negative_slope))
    out = m.aggregate(m.dropout(alpha, dropout) * m.src(z), "sum")
    out = m.heads(out, 1) if concat else m.head_mean(out)
    width = heads * out_dim if concat else out_dim
    if residual:
        out = out + m.linear(x, m.weight("res", (in_dim, width), stored="transposed"))
    return out + m.weight("bias", (width,), init="zeros") if bias else out


def transformer(m, in_dim, out_dim, heads=1, concat=True, beta=False, dropout=0.0, bias=True,
                root_weight=True):
    """PyG ``TransformerConv``: scaled dot-product attention over incoming edges plus the root
    projection, mixed by PyG's gate with ``beta`` (its three-part weight given as the slices
    ``beta_out``, ``beta_root``, ``beta_diff`` of ``lin_beta.weight``).  The projections'
    weights are stored as PyG's ``nn.Linear`` weights, ``[out, in]``."""
    x = m.node_input("x", in_dim)
    width = heads * out_dim if concat else out_dim

    def w(name, shape):    # stored as PyG's nn.Linear weights, [out, in]
        return m.weight(name, shape, stored="transposed")

    def proj(name):        # W x (+ b), then heads of out_dim
        y = m.linear(x, w(name, (in_dim, heads * out_dim)))
        if bias:
            y = y + m.weight(name + "_bias", (heads * out_dim,), init="zeros")
        return m.heads(y, heads)
    q, k, v = proj("query"), proj("key"), proj("value")
    alpha = m.edge_softmax(m.dot(m.dst(q), m.src(k)) / math.sqrt(out_dim))
    out = m.aggregate(m.dropout(alpha, dropout) * m.src(v), "sum")
    out = m.heads(out, 1) if concat else m.head_mean(out)
    if not root_weight:
        return out
    r = m.linear(x, w("skip", (in_dim, width)))
    if bias:
        r = r + m.weight("skip_bias", (width,), init="zeros")
    if not beta:
        return out + r
    gate = m.sigmoid(m.linear(out, w("beta_out", (width, 1)))
                     + m.linear(r, w("beta_root", (width, 1)))
                     + m.linear(out - r, w("beta_diff", (width, 1))))
    return out + gate * (r - out)                    # = gate r + (1 - gate) out


def agnn(m, in_dim):
    """PyG ``AGNNConv`` on a graph whose self loops the caller arranged: softmax over
    incoming edges of ``beta cos(x_v, x_u)``, then the sum of ``x_u`` (``beta``: a one-element
    weight; a fixed 1 is passed as such)."""
    x = m.node_input("x", in_dim)
    k = m.normalize(x)
    q = k * m.weight("beta", (1,), init="ones")
    alpha = m.edge_softmax(m.dot(m.dst(q), m.src(k)))
    return m.aggregate(alpha * m.src(x), "sum")
