"""The runner's object store (workflows/runner/objects.py, object_rules.py, selectors.py):
API-server metadata, names, label selection, patches, garbage collection, bounds,
and loading `--objects` files."""

from __future__ import annotations

import pytest
from ckptflow.workflows.runner import object_rules, selectors
from ckptflow.workflows.runner import objects as ob


def _cm(name=None, labels=None, **extra):
    meta = {"name": name} if name else {"generateName": "cm-"}
    if labels is not None:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, **extra}


def test_create_fills_metadata_as_the_api_server_does():
    store = ob.ObjectStore()
    made = store.create(_cm(data={"k": "v"}))
    meta = made["metadata"]
    assert meta["name"].startswith("cm-") and len(meta["name"]) == len("cm-") + 5
    assert meta["namespace"] == "default" and meta["uid"] and meta["resourceVersion"]
    assert meta["creationTimestamp"].endswith("Z")
    assert store.get("ConfigMap", meta["name"]) == made
    # kubectl's names for the kind find it too
    assert store.get("cm", meta["name"]) == made and store.get("configmaps", meta["name"]) == made


def test_create_twice_is_already_exists_and_bad_names_are_invalid():
    store = ob.ObjectStore()
    store.create(_cm("a"))
    with pytest.raises(ob.AlreadyExists, match='ConfigMap "a" already exists'):
        store.create(_cm("a"))
    with pytest.raises(ob.Invalid, match="DNS-1123"):
        store.create(_cm("Not_A_Name"))
    with pytest.raises(ob.Invalid, match="no kind"):
        store.create({"metadata": {"name": "x"}})
    with pytest.raises(ob.Invalid, match="name or metadata.generateName"):
        store.create({"kind": "Pod", "metadata": {}})


def test_label_selection_equality_and_set_based():
    store = ob.ObjectStore()
    store.create(_cm("a", {"app": "x", "tier": "web", "n": "5"}))
    store.create(_cm("b", {"app": "y", "tier": "db"}))
    store.create(_cm("c"))

    def names(sel):
        return [o["metadata"]["name"] for o in store.list("ConfigMap", sel)]

    assert names(None) == ["a", "b", "c"]
    assert names("app=x") == ["a"]
    assert names("app!=x") == ["b", "c"]
    assert names("tier in (web, db)") == ["a", "b"]
    assert names("tier notin (web)") == ["b", "c"]
    assert names("app,!n") == ["b"]
    assert names("n>4") == ["a"] and names("n<4") == []
    assert names({"matchLabels": {"app": "y"}}) == ["b"]
    assert names({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}) == ["a", "b"]
    with pytest.raises(ob.Invalid):
        selectors.parse_selector("a in (x")
    with pytest.raises(ob.Invalid):
        selectors.parse_selector("a > b")


def test_patches_merge_json_and_strategic():
    store = ob.ObjectStore()
    store.create(_cm("a", {"k": "1"}, data={"x": "1", "y": "2"}))
    after = store.patch("ConfigMap", "a", {"data": {"x": None, "z": "3"}}, "merge")
    assert after["data"] == {"y": "2", "z": "3"}
    rv = after["metadata"]["resourceVersion"]
    after = store.patch(
        "ConfigMap",
        "a",
        [{"op": "add", "path": "/metadata/annotations", "value": {"f": "b"}}],
        "json",
    )
    assert after["metadata"]["annotations"] == {"f": "b"}
    assert int(after["metadata"]["resourceVersion"]) > int(rv)
    after = store.patch("ConfigMap", "a", {"metadata": {"labels": {"j": "2"}}}, "strategic")
    assert after["metadata"]["labels"] == {"k": "1", "j": "2"}
    # identity is not patchable
    after = store.patch("ConfigMap", "a", {"metadata": {"uid": "x", "name": "b"}}, "merge")
    assert after["metadata"]["name"] == "a" and after["metadata"]["uid"] != "x"
    with pytest.raises(ob.Invalid, match="json patch"):
        store.patch("ConfigMap", "a", [{"op": "remove", "path": "/nope"}], "json")
    with pytest.raises(ob.NotFound):
        store.patch("ConfigMap", "zz", {}, "merge")


def test_apply_creates_then_merges_and_replace_keeps_uid():
    store = ob.ObjectStore()
    made = store.apply(_cm("a", data={"x": "1"}))
    again = store.apply(_cm("a", data={"y": "2"}))
    assert again["metadata"]["uid"] == made["metadata"]["uid"]
    assert again["data"] == {"x": "1", "y": "2"}
    replaced = store.replace(_cm("a", data={"z": "3"}))
    assert replaced["data"] == {"z": "3"} and replaced["metadata"]["uid"] == made["metadata"]["uid"]
    with pytest.raises(ob.NotFound):
        store.replace(_cm("nope"))


def test_delete_collects_dependents_like_the_garbage_collector():
    store = ob.ObjectStore()
    owner = store.create(_cm("owner"))
    ref = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "owner",
        "uid": owner["metadata"]["uid"],
    }
    child = store.create({"kind": "Pod", "metadata": {"name": "p", "ownerReferences": [ref]}})
    grand_ref = {"kind": "Pod", "name": "p", "uid": child["metadata"]["uid"]}
    store.create({"kind": "Secret", "metadata": {"name": "s", "ownerReferences": [grand_ref]}})
    seen = []
    store.on_delete.append(lambda o: seen.append(o["metadata"]["name"]))
    store.delete("ConfigMap", "owner")
    assert store.get("Pod", "p") is None and store.get("Secret", "s") is None
    assert seen == ["owner", "p", "s"]
    with pytest.raises(ob.NotFound):
        store.delete("ConfigMap", "owner")


def test_objects_owned_by_an_outside_owner_are_deleted_with_it():
    store = ob.ObjectStore()
    ref = {"kind": "Workflow", "name": "wf", "uid": "wf-uid"}
    store.create({"kind": "ConfigMap", "metadata": {"name": "o", "ownerReferences": [ref]}})
    store.create(_cm("free"))
    assert [o["metadata"]["name"] for o in store.delete_owned_by("wf-uid")] == ["o"]
    assert store.get("ConfigMap", "o") is None and store.get("ConfigMap", "free") is not None


def test_hostile_objects_are_bounded(monkeypatch):
    store = ob.ObjectStore()
    deep: dict = {}
    cur = deep
    for _ in range(object_rules.MAX_DEPTH + 2):
        cur["x"] = {}
        cur = cur["x"]
    with pytest.raises(ob.Invalid, match="nested deeper"):
        store.create(_cm("deep", data=deep))
    with pytest.raises(ob.Invalid, match="byte limit"):
        store.create(_cm("big", data={"k": "x" * (object_rules.MAX_OBJECT_BYTES + 1)}))
    monkeypatch.setattr(ob, "MAX_OBJECTS", 2)
    store.create(_cm("one"))
    store.create(_cm("two"))
    with pytest.raises(ob.Invalid, match="its limit"):
        store.create(_cm("three"))


def test_field_value_reads_paths_as_gjson():
    obj = {"status": {"succeeded": 3, "phase": "Succeeded"}, "spec": {"c": [{"n": "a"}]}}
    assert selectors.field_value(obj, "status.succeeded") == (True, 3)
    assert selectors.field_value(obj, "spec.c.0.n") == (True, "a")
    assert selectors.field_value(obj, "status.failed") == (False, None)


def test_load_objects_reads_many_documents_and_names_a_damaged_file(tmp_path):
    good = tmp_path / "objs.yaml"
    good.write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: {k: v}\n---\n"
        "kind: List\nitems:\n- {kind: Secret, metadata: {name: s}, stringData: {p: q}}\n"
    )
    store = ob.load_objects([str(good)])
    assert store.get("ConfigMap", "a")["data"] == {"k": "v"}
    assert store.get("Secret", "s") is not None
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "kind: ConfigMap\nmetadata: {name: a}\n---\nkind: ConfigMap\nmetadata: {name: a}\n"
    )
    with pytest.raises(ob.AlreadyExists, match=f"{bad}: ConfigMap"):
        ob.load_objects([str(bad)])
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: [\n")
    with pytest.raises(ob.Invalid, match="not valid YAML"):
        ob.load_objects([str(broken)])
    with pytest.raises(ob.Invalid, match="cannot read"):
        ob.load_objects([str(tmp_path / "missing.yaml")])


def test_a_yaml_alias_bomb_is_refused_quickly(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        prev = f"*a{i - 1}"
        lines.append(f"a{i}: &a{i} [{', '.join([prev] * 10)}]")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(
        "kind: ConfigMap\nmetadata: {name: b}\ndata:\n" + "".join(f"  {ln}\n" for ln in lines)
    )
    with pytest.raises(ob.Invalid, match="more than 100000 values"):
        ob.load_objects([str(bomb)])
