"""Restore the variables a TF2 SavedModel's signatures read but its saver_def leaves out.

A Keras 3 variable (TF backend) is a trackable wrapping a tf.Variable. When
`tf.saved_model.save` exports it, the wrapped tf.Variable becomes one graph variable (the one
the signature functions capture) and the wrapper a second, `tf.Variable(first)`, which the
object graph and the saver_def's restore function point at. Graph loaders (TF Serving's C++
LoadSavedModel, tf.compat.v1's loader) run only that restore function, so the captured copies
stay uninitialized and every request fails with "Could not find variable …".
`tf.saved_model.load` is unaffected: it rebinds each capture to its object-graph node and
restores that node from the checkpoint. So do we, for the captures the restore op missed:
signature call → bound object-graph node → checkpoint node (same path from the root) → key.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import node_def_pb2
from tensorflow.core.protobuf import meta_graph_pb2, saved_object_graph_pb2, trackable_object_graph_pb2

from tfservo.core.errors import first_line

__all__ = ["restore_captured_variables", "UnrestorableVariables"]

_CALL_OPS = {"StatefulPartitionedCall", "PartitionedCall"}
_PASS_THROUGH_OPS = {"Identity", "IdentityN"}
_OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
_VALUE_ATTRIBUTE = "VARIABLE_VALUE"


class UnrestorableVariables(Exception):
    """Some variable a signature reads has no value in the Session and none can be restored."""


def restore_captured_variables(
    session: tf.compat.v1.Session,
    meta_graph_def: meta_graph_pb2.MetaGraphDef,
    export_dir: str,
    signature_names: Iterable[str],
) -> list[str]:
    """Restore every variable the signatures capture that is still uninitialized; returns their names.

    Raises UnrestorableVariables (naming the variables and why) when one stays uninitialized.
    """
    captured = _captured_variables(meta_graph_def, signature_names)
    missing = _uninitialized(session, sorted(captured))
    if not missing:
        return []
    prefix = os.path.join(export_dir, "variables", "variables")
    try:
        reader = tf.train.load_checkpoint(prefix)
        checkpoint_graph = trackable_object_graph_pb2.TrackableObjectGraph()
        checkpoint_graph.ParseFromString(reader.get_tensor(_OBJECT_GRAPH_KEY))
    except Exception as exc:
        raise UnrestorableVariables(
            f"variables {_names(missing)} are not restored by the saver_def and the checkpoint at "
            f"{prefix} cannot be read by object ({first_line(exc)})"
        ) from None
    keys = _checkpoint_keys(meta_graph_def.object_graph_def, checkpoint_graph)
    plan = _plan(meta_graph_def, reader, {name: keys.get(captured[name]) for name in missing})
    try:
        _assign_from_checkpoint(session, prefix, plan)
    except (tf.errors.OpError, ValueError, KeyError) as exc:
        raise UnrestorableVariables(f"restoring {_names(missing)} failed: {first_line(exc)}") from None
    still = _uninitialized(session, missing)
    if still:
        raise UnrestorableVariables(f"variables {_names(still)} are still uninitialized after restoring them")
    return missing


def _plan(
    meta_graph_def: meta_graph_pb2.MetaGraphDef, reader: Any, keys: dict[str, str | None]
) -> list[tuple[str, str, tf.DType]]:
    """(variable, checkpoint key, dtype) for each; UnrestorableVariables if a value is absent or unfit."""
    nodes = {n.name: n for n in meta_graph_def.graph_def.node}
    shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    plan: list[tuple[str, str, tf.DType]] = []
    problems: list[str] = []
    for name, key in keys.items():
        if key is None or key not in shapes:
            problems.append(f"{name} (no value in the checkpoint)")
            continue
        dtype = tf.dtypes.as_dtype(nodes[name].attr["dtype"].type)
        shape = tf.TensorShape(nodes[name].attr["shape"].shape)
        if dtypes[key] != dtype or not shape.is_compatible_with(shapes[key]):
            found = f"{dtypes[key].name}{shapes[key]} at {key}"
            problems.append(f"{name} ({dtype.name}{shape} in the graph, {found})")
            continue
        plan.append((name, key, dtype))
    if problems:
        raise UnrestorableVariables(
            f"variables the signatures read cannot be restored: {', '.join(problems)}"
        )
    return plan


def _assign_from_checkpoint(
    session: tf.compat.v1.Session, prefix: str, plan: list[tuple[str, str, tf.DType]]
) -> None:
    graph = session.graph
    with graph.as_default(), tf.name_scope("tfservo_restore_captured"):
        with tf.device("/cpu:0"):  # RestoreV2 has only a CPU kernel
            values = tf.raw_ops.RestoreV2(
                prefix=prefix,
                tensor_names=[key for _, key, _ in plan],
                shape_and_slices=[""] * len(plan),
                dtypes=[dtype for _, _, dtype in plan],
            )
        assigns = [
            tf.raw_ops.AssignVariableOp(resource=graph.get_tensor_by_name(f"{name}:0"), value=value)
            for (name, _, _), value in zip(plan, values)
        ]
    session.run(assigns)


def _captured_variables(
    meta_graph_def: meta_graph_pb2.MetaGraphDef, signature_names: Iterable[str]
) -> dict[str, int]:
    """Graph variable (VarHandleOp name) → object-graph node id, for captures the signatures reach."""
    functions = meta_graph_def.object_graph_def.concrete_functions
    nodes = {n.name: n for n in meta_graph_def.graph_def.node}
    pending = [
        _node_name(info.name)
        for name in signature_names
        for info in meta_graph_def.signature_def[name].outputs.values()
        if info.name
    ]
    seen: set[str] = set()
    captured: dict[str, int] = {}
    while pending:
        name = pending.pop()
        node = nodes.get(name)
        if name in seen or node is None:
            continue
        seen.add(name)
        data_inputs = [_node_name(i) for i in node.input if not i.startswith("^")]
        pending.extend(data_inputs)
        function = functions.get(node.attr["f"].func.name) if node.op in _CALL_OPS else None
        if function is None or not function.bound_inputs:
            continue
        for ref, node_id in zip(data_inputs[-len(function.bound_inputs) :], function.bound_inputs):
            handle = _through_identities(nodes, ref)
            if handle is not None and handle.op == "VarHandleOp":
                captured[handle.name] = node_id
    return captured


def _checkpoint_keys(
    saved: saved_object_graph_pb2.SavedObjectGraph,
    checkpoint: trackable_object_graph_pb2.TrackableObjectGraph,
) -> dict[int, str]:
    """Saved object-graph node id → its variable's checkpoint key, matching nodes by path from the root."""
    keys: dict[int, str] = {}
    pending, seen = [(0, 0)], {0}
    while pending:
        saved_id, checkpoint_id = pending.pop()
        for attribute in checkpoint.nodes[checkpoint_id].attributes:
            if attribute.name == _VALUE_ATTRIBUTE:
                keys[saved_id] = attribute.checkpoint_key
        children = {c.local_name: c.node_id for c in checkpoint.nodes[checkpoint_id].children}
        for child in saved.nodes[saved_id].children:
            if child.node_id not in seen and child.local_name in children:
                seen.add(child.node_id)
                pending.append((child.node_id, children[child.local_name]))
    return keys


def _uninitialized(session: tf.compat.v1.Session, names: list[str]) -> list[str]:
    if not names:
        return []
    graph = session.graph
    with graph.as_default(), tf.name_scope("tfservo_check_captured"):
        checks = [tf.raw_ops.VarIsInitializedOp(resource=graph.get_tensor_by_name(f"{n}:0")) for n in names]
    return [name for name, ok in zip(names, session.run(checks)) if not ok]


def _through_identities(nodes: dict[str, node_def_pb2.NodeDef], ref: str) -> node_def_pb2.NodeDef | None:
    node = nodes.get(ref)
    while node is not None and node.op in _PASS_THROUGH_OPS and node.input:
        node = nodes.get(_node_name(node.input[0]))
    return node


def _node_name(ref: str) -> str:
    return ref.lstrip("^").split(":")[0]


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:5])
    return shown + (f" and {len(names) - 5} more" if len(names) > 5 else "")
