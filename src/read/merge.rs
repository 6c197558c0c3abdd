//! Pure merging of shard results: the k-way merge of sorted streams, and the split of an
//! aggregation pipeline into a shard part and a router part (with `$group` partials re-grouped
//! at the router).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use bson::{doc, Bson, Document};

use crate::engine::query::SortSpec;

/// Merges per-shard lists, each already sorted by `sort`, into one sorted list. Ties keep the
/// order of the shard lists (stable), so equal keys come out deterministically.
pub fn k_way_merge(sort: &SortSpec, streams: Vec<Vec<Document>>) -> Vec<Document> {
    struct Head<'a> {
        doc: Document,
        stream: usize,
        pos: usize,
        sort: &'a SortSpec,
    }
    impl PartialEq for Head<'_> {
        fn eq(&self, other: &Self) -> bool {
            self.cmp(other) == Ordering::Equal
        }
    }
    impl Eq for Head<'_> {}
    impl PartialOrd for Head<'_> {
        fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
            Some(self.cmp(other))
        }
    }
    impl Ord for Head<'_> {
        fn cmp(&self, other: &Self) -> Ordering {
            // BinaryHeap is a max-heap: reverse for the smallest first; ties by stream order.
            self.sort
                .compare(&self.doc, &other.doc)
                .then_with(|| self.stream.cmp(&other.stream))
                .then_with(|| self.pos.cmp(&other.pos))
                .reverse()
        }
    }
    let total: usize = streams.iter().map(|s| s.len()).sum();
    let mut iters: Vec<std::vec::IntoIter<Document>> =
        streams.into_iter().map(|s| s.into_iter()).collect();
    let mut heap = BinaryHeap::new();
    for (i, it) in iters.iter_mut().enumerate() {
        if let Some(doc) = it.next() {
            heap.push(Head {
                doc,
                stream: i,
                pos: 0,
                sort,
            });
        }
    }
    let mut out = Vec::with_capacity(total);
    while let Some(Head {
        doc, stream, pos, ..
    }) = heap.pop()
    {
        out.push(doc);
        if let Some(next) = iters[stream].next() {
            heap.push(Head {
                doc: next,
                stream,
                pos: pos + 1,
                sort,
            });
        }
    }
    out
}

/// How a pipeline runs on a sharded collection.
#[derive(Debug, Clone, PartialEq)]
pub struct SplitPipeline {
    /// Stages each shard runs.
    pub shard_part: Vec<Bson>,
    /// When set, shard results are merge-sorted by this spec before the router part.
    pub merge_sort: Option<Document>,
    /// Stages the router runs over the merged shard results.
    pub router_part: Vec<Bson>,
}

fn stage_name(s: &Bson) -> Option<&str> {
    s.as_document()
        .and_then(|d| d.keys().next())
        .map(|k| k.as_str())
}

/// Splits a pipeline at its first stage that needs all the data. Stages before it run on every
/// shard; a `$sort` (with a following `$limit`) runs on the shards and is merged; a `$group`
/// whose accumulators are `$sum`, `$min`, `$max`, `$avg` or `$count`
/// runs as partial groups on the shards and is re-grouped at the router (`$push`, `$addToSet`,
/// `$first` and `$last` run at the router over everything); `$count`, `$skip` and
/// `$limit` likewise. Anything else from that point runs at the router over everything the
/// shards return.
pub fn split_pipeline(pipeline: &[Bson]) -> SplitPipeline {
    let blocking = pipeline.iter().position(|s| {
        matches!(
            stage_name(s),
            Some(
                "$group"
                    | "$sort"
                    | "$count"
                    | "$skip"
                    | "$limit"
                    // Stages that read other collections or need every document at once run
                    // at the router, over everything the shards return.
                    | "$lookup"
                    | "$graphLookup"
                    | "$unionWith"
                    | "$facet"
                    | "$sample"
                    | "$bucket"
                    | "$bucketAuto"
                    | "$sortByCount"
                    | "$setWindowFields"
                    // Gap filling needs every document of a partition (and, for `$densify`'s
                    // "full" bounds, the lowest and highest value of all of them).
                    | "$densify"
                    | "$fill"
            )
        )
    });
    let Some(b) = blocking else {
        return SplitPipeline {
            shard_part: pipeline.to_vec(),
            merge_sort: None,
            router_part: Vec::new(),
        };
    };
    let prefix = pipeline[..b].to_vec();
    let stage = &pipeline[b];
    let rest = pipeline[b + 1..].to_vec();
    let all_at_router = || SplitPipeline {
        shard_part: prefix.clone(),
        merge_sort: None,
        router_part: pipeline[b..].to_vec(),
    };
    let Some(spec) = stage.as_document() else {
        return all_at_router();
    };
    match stage_name(stage) {
        Some("$sort") => {
            let Ok(sort) = spec.get_document("$sort") else {
                return all_at_router();
            };
            let mut shard_part = prefix.clone();
            shard_part.push(stage.clone());
            // A $limit (and the $skips before it) right after the sort bounds each shard's part.
            let mut bound: Option<i64> = None;
            let mut skip = 0i64;
            for s in &rest {
                match stage_name(s) {
                    Some("$skip") => {
                        skip += s
                            .as_document()
                            .and_then(|d| crate::value::field::number_field(d, "$skip"))
                            .unwrap_or(0)
                    }
                    Some("$limit") => {
                        bound = s
                            .as_document()
                            .and_then(|d| crate::value::field::number_field(d, "$limit"))
                            .map(|l| l + skip);
                        break;
                    }
                    _ => break,
                }
            }
            if let Some(n) = bound {
                shard_part.push(Bson::Document(doc! {"$limit": n}));
            }
            SplitPipeline {
                shard_part,
                merge_sort: Some(sort.clone()),
                router_part: rest,
            }
        }
        Some("$skip") | Some("$limit") => {
            // Shards return skip + limit at most; the router applies both.
            let mut shard_part = prefix.clone();
            let mut total = 0i64;
            let mut bounded = false;
            for s in &pipeline[b..] {
                match stage_name(s) {
                    Some("$skip") => {
                        total += s
                            .as_document()
                            .and_then(|d| crate::value::field::number_field(d, "$skip"))
                            .unwrap_or(0)
                    }
                    Some("$limit") => {
                        total += s
                            .as_document()
                            .and_then(|d| crate::value::field::number_field(d, "$limit"))
                            .unwrap_or(0);
                        bounded = true;
                        break;
                    }
                    _ => break,
                }
            }
            if bounded {
                shard_part.push(Bson::Document(doc! {"$limit": total}));
            }
            SplitPipeline {
                shard_part,
                merge_sort: None,
                router_part: pipeline[b..].to_vec(),
            }
        }
        Some("$count") => {
            let Ok(field) = spec.get_str("$count") else {
                return all_at_router();
            };
            let mut shard_part = prefix.clone();
            shard_part.push(Bson::Document(doc! {"$count": field}));
            let mut router_part = vec![
                Bson::Document(
                    doc! {"$group": {"_id": Bson::Null, field: {"$sum": format!("${field}")}}},
                ),
                Bson::Document(doc! {"$project": {"_id": 0, field: 1}}),
            ];
            router_part.extend(rest);
            SplitPipeline {
                shard_part,
                merge_sort: None,
                router_part,
            }
        }
        Some("$group") => match split_group(spec.get_document("$group").ok()) {
            Some((partial, merge)) => {
                let mut shard_part = prefix.clone();
                shard_part.push(Bson::Document(doc! {"$group": partial}));
                let mut router_part = merge;
                router_part.extend(rest);
                SplitPipeline {
                    shard_part,
                    merge_sort: None,
                    router_part,
                }
            }
            None => all_at_router(),
        },
        _ => all_at_router(),
    }
}

/// A `$group` as partial groups per shard plus the stages that re-group them at the router;
/// `None` when an accumulator is not split (`$first`/`$last` need the global order, `$push`
/// and `$addToSet` gather everything anyway).
fn split_group(group: Option<&Document>) -> Option<(Document, Vec<Bson>)> {
    let group = group?;
    let mut partial = Document::new();
    let mut merged = Document::new();
    let mut finish = Document::new();
    let mut needs_finish = false;
    partial.insert("_id", group.get("_id")?.clone());
    merged.insert("_id", "$_id");
    for (name, acc) in group {
        if name == "_id" {
            continue;
        }
        let acc = acc.as_document()?;
        let (op, arg) = acc.iter().next()?;
        let p = |suffix: &str| format!("{name}{suffix}");
        match op.as_str() {
            "$sum" | "$min" | "$max" => {
                partial.insert(name.clone(), doc! {op.clone(): arg.clone()});
                let merge_op = if op == "$sum" { "$sum" } else { op.as_str() };
                merged.insert(name.clone(), doc! {merge_op: format!("${name}")});
                finish.insert(name.clone(), format!("${name}"));
            }
            "$count" => {
                partial.insert(name.clone(), doc! {"$sum": 1});
                merged.insert(name.clone(), doc! {"$sum": format!("${name}")});
                finish.insert(name.clone(), format!("${name}"));
            }
            "$avg" => {
                let sum = p("__sluiceSum");
                let count = p("__sluiceCount");
                partial.insert(sum.clone(), doc! {"$sum": arg.clone()});
                partial.insert(
                    count.clone(),
                    doc! {"$sum": {"$cond": [{"$isNumber": arg.clone()}, 1, 0]}},
                );
                merged.insert(sum.clone(), doc! {"$sum": format!("${sum}")});
                merged.insert(count.clone(), doc! {"$sum": format!("${count}")});
                finish.insert(
                    name.clone(),
                    doc! {"$cond": [{"$eq": [format!("${count}"), 0]}, Bson::Null, {"$divide": [format!("${sum}"), format!("${count}")]}]},
                );
                needs_finish = true;
            }
            _ => return None,
        }
    }
    let mut stages = vec![Bson::Document(doc! {"$group": merged})];
    if needs_finish {
        let mut project = doc! {"_id": "$_id"};
        for (k, v) in finish {
            project.insert(k, v);
        }
        stages.push(Bson::Document(doc! {"$project": project}));
    }
    Some((partial, stages))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::aggregate;

    fn sorted(spec: Document, mut docs: Vec<Document>) -> Vec<Document> {
        SortSpec::parse(&spec).unwrap().sort(&mut docs);
        docs
    }

    #[test]
    fn k_way_merge_orders_across_types_and_keeps_ties_stable() {
        let spec = doc! {"v": 1};
        let s = SortSpec::parse(&spec).unwrap();
        let a = sorted(
            spec.clone(),
            vec![
                doc! {"_id": "a1", "v": 1},
                doc! {"_id": "a2", "v": "x"},
                doc! {"_id": "a3", "v": 2.5},
            ],
        );
        let b = sorted(
            spec.clone(),
            vec![
                doc! {"_id": "b1", "v": Bson::Null},
                doc! {"_id": "b2", "v": 1i64},
                doc! {"_id": "b3", "v": {"o": 1}},
            ],
        );
        let c = sorted(
            spec.clone(),
            vec![doc! {"_id": "c1", "v": 1.0}, doc! {"_id": "c2"}],
        );
        let merged = k_way_merge(&s, vec![a, b, c]);
        let ids: Vec<&str> = merged.iter().map(|d| d.get_str("_id").unwrap()).collect();
        // null and missing first (stream order), then the three 1s (stream order), 2.5, strings, objects.
        assert_eq!(ids, ["b1", "c2", "a1", "b2", "c1", "a3", "a2", "b3"]);
        let desc = SortSpec::parse(&doc! {"v": -1}).unwrap();
        let x = sorted(doc! {"v": -1}, vec![doc! {"v": 3}, doc! {"v": 1}]);
        let y = sorted(doc! {"v": -1}, vec![doc! {"v": 2}, doc! {"v": 0}]);
        let m: Vec<i32> = k_way_merge(&desc, vec![x, y])
            .iter()
            .map(|d| d.get_i32("v").unwrap())
            .collect();
        assert_eq!(m, [3, 2, 1, 0]);
    }

    fn shards() -> Vec<Vec<Document>> {
        vec![
            vec![
                doc! {"k": "a", "q": 1},
                doc! {"k": "b", "q": 2},
                doc! {"k": "a", "q": "not a number"},
            ],
            vec![doc! {"k": "a", "q": 3}, doc! {"k": "c", "q": 4.5}],
            vec![],
        ]
    }

    /// Runs a split pipeline over per-shard data and compares with running it on everything.
    fn check(pipeline: Vec<Bson>) {
        let all: Vec<Document> = shards().into_iter().flatten().collect();
        let expected = aggregate::run(&pipeline, all).unwrap();
        let split = split_pipeline(&pipeline);
        let parts: Vec<Vec<Document>> = shards()
            .into_iter()
            .map(|s| aggregate::run(&split.shard_part, s).unwrap())
            .collect();
        let merged = match &split.merge_sort {
            Some(sort) => k_way_merge(&SortSpec::parse(sort).unwrap(), parts),
            None => parts.into_iter().flatten().collect(),
        };
        let mut got = aggregate::run(&split.router_part, merged).unwrap();
        let mut expected = expected;
        let key = |d: &Document| format!("{:?}", d.get("_id"));
        if split.merge_sort.is_none() && !pipeline.iter().any(|s| stage_name(s) == Some("$sort")) {
            got.sort_by_key(key);
            expected.sort_by_key(key);
        }
        assert_eq!(got, expected, "{pipeline:?} split as {split:?}");
    }

    #[test]
    fn gap_filling_runs_after_the_merge() {
        let pipeline = vec![
            Bson::Document(doc! {"$match": {"q": {"$type": "number"}}}),
            Bson::Document(
                doc! {"$densify": {"field": "q", "partitionByFields": ["k"], "range": {"step": 1, "bounds": "full"}}},
            ),
            Bson::Document(
                doc! {"$fill": {"sortBy": {"q": 1}, "partitionBy": "$k", "output": {"n": {"value": 0}}}},
            ),
        ];
        let split = split_pipeline(&pipeline);
        assert_eq!(split.shard_part, pipeline[..1].to_vec());
        assert_eq!(split.router_part, pipeline[1..].to_vec());
        let fill = vec![Bson::Document(
            doc! {"$fill": {"sortBy": {"q": 1}, "output": {"k": {"method": "locf"}}}},
        )];
        assert_eq!(split_pipeline(&fill).router_part, fill);
    }

    #[test]
    fn split_pipelines_agree_with_unsplit_ones() {
        check(vec![Bson::Document(
            doc! {"$group": {"_id": "$k", "s": {"$sum": "$q"}, "n": {"$sum": 1}, "mn": {"$min": "$q"}, "mx": {"$max": "$q"}, "avg": {"$avg": "$q"}, "c": {"$count": {}}}},
        )]);
        check(vec![
            Bson::Document(doc! {"$match": {"k": "a"}}),
            Bson::Document(doc! {"$group": {"_id": 1, "n": {"$sum": 1}}}),
        ]);
        check(vec![
            Bson::Document(
                doc! {"$group": {"_id": "$k", "all": {"$push": "$q"}, "set": {"$addToSet": "$k"}}},
            ),
            Bson::Document(doc! {"$project": {"_id": 1, "n": {"$size": "$all"}, "set": 1}}),
        ]);
        let split = split_pipeline(&[Bson::Document(
            doc! {"$group": {"_id": "$k", "all": {"$push": "$q"}}},
        )]);
        assert!(split.shard_part.is_empty(), "$push runs at the router");
        check(vec![
            Bson::Document(doc! {"$sort": {"q": -1}}),
            Bson::Document(doc! {"$skip": 1}),
            Bson::Document(doc! {"$limit": 2}),
        ]);
        check(vec![
            Bson::Document(doc! {"$match": {"q": {"$type": "number"}}}),
            Bson::Document(doc! {"$count": "n"}),
        ]);
        check(vec![
            Bson::Document(doc! {"$skip": 1}),
            Bson::Document(doc! {"$limit": 10}),
            Bson::Document(doc! {"$count": "n"}),
        ]);
        check(vec![
            Bson::Document(doc! {"$sort": {"q": 1}}),
            Bson::Document(doc! {"$group": {"_id": "$k", "f": {"$first": "$q"}}}),
        ]);
        let split = split_pipeline(&[Bson::Document(
            doc! {"$group": {"_id": "$k", "f": {"$first": "$q"}}},
        )]);
        assert!(
            split.router_part.len() == 1 && split.shard_part.is_empty(),
            "$first is not split"
        );
    }
}
