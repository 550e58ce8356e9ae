"""Named statistics of the paper datasets, for the synthetic generator (``synthetic.py``).

A :class:`Profile` lists the node types (with node counts) and the relations (each between a
fixed source and destination node type, with an edge count) of one public dataset, plus what the
generator needs to shape degrees, features, labels and splits.  Node types become contiguous id
ranges in the order they are listed; the node type carrying labels is always listed first, so
label ids and global ids coincide.

Every number below cites its source in a comment.  Where the published record has only totals,
the per-type / per-relation breakdown is *derived* deterministically (a fixed Zipf split and a
fixed seeded assignment of (src_type, dst_type) pairs): totals then match the published ones but
the breakdown is synthetic; such profiles carry ``breakdown="derived"``.

Sources:
  [OGB]     Hu et al., "Open Graph Benchmark", NeurIPS 2020, and https://ogb.stanford.edu/docs/
            (ogbn-mag, ogbn-arxiv, ogbn-proteins, ogbn-products, ogbl-biokg, ogbl-wikikg2).
  [DGL-RDF] the docstrings of dgl.data.rdf.{AIFB,MUTAG,BGS,AM}Dataset (dmlc/dgl,
            python/dgl/data/rdf.py): node / edge totals "including reverse edges", target
            category, classes, train/test split.
  [Hector]  Wu et al., "Hector" (ASPLOS 2024) and its code (K-Wu/HET, graphiler_datasets.py,
            itself adapted from Graphiler): which DGL/OGB object each benchmark name loads
            ("fb15k" is dgl.data.FB15k237Dataset() with its default reverse=True; "mag" is
            ogbn-mag as distributed; "wikikg2"/"biokg" the OGB training graphs), and the
            canonical relation counts aifb 104, mutag 50, bgs 122, am 108, biokg 51, wikikg2 535.
  [shared]  computed here from the real files in ../shared/data (AIFB N-Triples parsed with
            DGL's AIFBDataset rules: reproduces DGL's 7,262 nodes / 24,405 forward edges / 52
            canonical relations exactly; FB15k-237 train+valid+test triples).
  [Planetoid] Yang et al. 2016 / Kipf & Welling 2017 (Cora, PubMed), as in PyG and DGL.
  [Reddit]  Hamilton et al., "GraphSAGE", NeurIPS 2017, as in PyG/DGL Reddit.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

#: A node whose in-degree is at least this is counted as a super node (the threshold used for the
#: degree statistics in ../shared/data/README.md).
SUPER_NODE_DEGREE = 1000

#: Zipf exponent of the per-node weights of a node type with no published degree target.  It is
#: the exponent that reproduces the real FB15k-237 graph's max/mean in-degree ratio (8,642 / 42.65,
#: [shared]) with a pure Zipf law; a single calibrated default, not a published number per dataset.
DEFAULT_SKEW = 0.66


@dataclass(frozen=True)
class NodeTypeSpec:
    """One node type: its name, its node count and optional degree targets.

    ``max_degree``: the published (or measured) largest in-degree of a node of this type in the
    full-scale graph; the generator picks the Zipf exponent that makes the expected largest
    in-degree equal to it (keeping the max/mean ratio when the graph is scaled).
    ``super_nodes``: the number of nodes of this type with in-degree >= ``SUPER_NODE_DEGREE``;
    when given together with ``max_degree`` the generator also fits the Zipf offset to it.
    ``skew``: the Zipf exponent to use when ``max_degree`` is not given (default DEFAULT_SKEW).
    """
    name: str
    count: int
    max_degree: Optional[int] = None
    super_nodes: Optional[int] = None
    skew: Optional[float] = None


@dataclass(frozen=True)
class RelationSpec:
    """One canonical relation ``(src, name, dst)`` with its edge count.

    ``reverse_of``: index (in the profile's relation list) of a forward relation whose edges this
    relation holds reversed, as DGL's ``insert_reverse`` / ``reverse=True`` builds them; its count
    equals the forward one and the generator emits the forward edges flipped.
    """
    src: str
    name: str
    dst: str
    count: int
    reverse_of: Optional[int] = None


@dataclass(frozen=True)
class Profile:
    """Statistics of one dataset.  See the module docstring for the conventions."""
    name: str
    source: str
    node_types: Tuple[NodeTypeSpec, ...]
    relations: Tuple[RelationSpec, ...]
    #: input feature width of the published dataset; None: it has none (relational models use
    #: embeddings), the generator then makes ``x`` only when asked for a feature_dim.
    feature_dim: Optional[int] = None
    #: published number of classes (tasks for a multi-label dataset); None: no node labels
    #: published (link-prediction data); the generator then labels only when asked.
    num_classes: Optional[int] = None
    multilabel: bool = False
    #: homogeneous undirected data stored with both directions (PyG/DGL/OGB loaders): the edge
    #: count is even and every edge appears in both directions.
    symmetric: bool = False
    #: published split sizes (train, val, test) of the labelled node type; None: random 60/20/20.
    split: Optional[Tuple[int, int, int]] = None
    #: "published": per-type and per-relation numbers are the real ones; "derived": only totals are
    #: published, the breakdown is synthetic (deterministic).
    breakdown: str = "published"
    notes: str = ""

    # ---- derived statistics (no generation needed) -------------------------------------------
    @property
    def num_nodes(self) -> int:
        return sum(t.count for t in self.node_types)

    @property
    def num_edges(self) -> int:
        return sum(r.count for r in self.relations)

    @property
    def num_relations(self) -> int:
        return len(self.relations)

    @property
    def num_node_types(self) -> int:
        return len(self.node_types)

    @property
    def heterogeneous(self) -> bool:
        return len(self.node_types) > 1 or len(self.relations) > 1

    @property
    def target_type(self) -> str:
        return self.node_types[0].name

    @property
    def node_type_names(self) -> List[str]:
        return [t.name for t in self.node_types]

    @property
    def relation_names(self) -> List[Tuple[str, str, str]]:
        return [(r.src, r.name, r.dst) for r in self.relations]

    def node_counts(self) -> Dict[str, int]:
        return {t.name: t.count for t in self.node_types}

    def in_edges(self, node_type: str) -> int:
        """Edges whose destination has this type (the in-degree mass of the type)."""
        return sum(r.count for r in self.relations if r.dst == node_type)

    def mean_in_degree(self, node_type: Optional[str] = None) -> float:
        t = node_type or self.target_type
        n = self.node_counts()[t]
        return self.in_edges(t) / n if n else 0.0


def _check_profile(p: Profile) -> Profile:
    names = [t.name for t in p.node_types]
    if len(set(names)) != len(names):
        raise ValueError(f"profile {p.name!r}: duplicate node type names")
    for i, r in enumerate(p.relations):
        if r.src not in names or r.dst not in names:
            raise ValueError(f"profile {p.name!r}: relation {i} {r.src, r.name, r.dst} names an "
                             f"unknown node type")
        if r.reverse_of is not None:
            f = p.relations[r.reverse_of]
            if f.reverse_of is not None or (f.src, f.dst, f.count) != (r.dst, r.src, r.count):
                raise ValueError(f"profile {p.name!r}: relation {i} is not the reverse of "
                                 f"relation {r.reverse_of}")
    if p.symmetric and (len(p.relations) != 1 or p.relations[0].count % 2):
        raise ValueError(f"profile {p.name!r}: symmetric needs one relation with an even count")
    return p


def _with_reverse(forward: List[Tuple[str, str, str, int]]) -> Tuple[RelationSpec, ...]:
    """Forward relations, then their reverses ``rev-<name>`` in the same order (DGL's layout)."""
    fwd = [RelationSpec(s, r, d, c) for s, r, d, c in forward]
    rev = [RelationSpec(d, f"rev-{r}", s, c, reverse_of=i)
           for i, (s, r, d, c) in enumerate(forward)]
    return tuple(fwd + rev)


def split_count(total: int, weights: List[float]) -> List[int]:
    """``total`` split over ``weights`` in integers summing exactly to ``total`` (largest remainder,
    ties to the lower index), each part at least 1 when ``total >= len(weights)``."""
    k = len(weights)
    floor_each = 1 if total >= k else 0
    rest = total - floor_each * k
    s = float(sum(weights))
    raw = [rest * w / s for w in weights]
    parts = [int(x) for x in raw]
    left = rest - sum(parts)
    order = sorted(range(k), key=lambda i: (-(raw[i] - parts[i]), i))
    for i in order[:left]:
        parts[i] += 1
    return [p + floor_each for p in parts]


def zipf_weights(k: int, exponent: float = 1.0) -> List[float]:
    return [(i + 1) ** -exponent for i in range(k)]


def _derived_rdf(name: str, total_nodes: int, num_types: int, target: str,
                 num_forward: int, forward_edges: int) -> Tuple[Tuple[NodeTypeSpec, ...],
                                                                List[Tuple[str, str, str, int]]]:
    """A deterministic breakdown for an RDF dataset whose per-type / per-relation numbers are not
    published: node types get Zipf(1) shares of the nodes, relations Zipf(1) shares of the forward
    edges (both in a seeded order), and each relation a (src, dst) pair drawn with probability
    proportional to the types' node counts; every type takes part in some relation and the target
    type receives at least one relation.  Seeded by the profile name only (stable forever)."""
    rng = random.Random(f"hector-synthetic-profile:{name}")
    type_names = [target] + [f"type{i}" for i in range(1, num_types)]
    order = list(range(num_types))
    rng.shuffle(order)
    shares = zipf_weights(num_types)
    counts = split_count(total_nodes, [shares[order[i]] for i in range(num_types)])
    types = tuple(NodeTypeSpec(n, c) for n, c in zip(type_names, counts))
    rel_order = list(range(num_forward))
    rng.shuffle(rel_order)
    eshares = zipf_weights(num_forward)
    ecounts = split_count(forward_edges, [eshares[rel_order[i]] for i in range(num_forward)])
    pairs = []
    cover = list(range(num_types))
    rng.shuffle(cover)
    for i in range(num_forward):
        src = rng.choices(range(num_types), weights=counts)[0]
        dst = rng.choices(range(num_types), weights=counts)[0]
        if i == 0:
            dst = 0                                  # the target type receives messages
        elif i <= num_types:
            src = cover[i - 1]                       # every type is a source somewhere
        pairs.append((src, dst))
    forward = [(type_names[s], f"rel{i}", type_names[d], ecounts[i])
               for i, (s, d) in enumerate(pairs)]
    return types, forward


# ---------------------------------------------------------------------------------------------
# Heterogeneous profiles (the Hector paper's datasets)
# ---------------------------------------------------------------------------------------------

# ogbn-mag [OGB]: 1,939,743 nodes, 21,111,007 edges, 4 node types, 4 relations, as distributed
# (Hector loads it without reverse edges [Hector]).  Paper nodes carry 128-d features in OGB
# (not generated by default), 349 venue classes, time split 629,571 / 64,879 / 41,939.
MAG = Profile(
    name="mag",
    source="ogbn-mag (OGB)",
    node_types=(
        NodeTypeSpec("paper", 736_389),
        NodeTypeSpec("author", 1_134_649),
        NodeTypeSpec("institution", 8_740),
        NodeTypeSpec("field_of_study", 59_965),
    ),
    relations=(
        RelationSpec("author", "affiliated_with", "institution", 1_043_998),
        RelationSpec("author", "writes", "paper", 7_145_660),
        RelationSpec("paper", "cites", "paper", 5_416_271),
        RelationSpec("paper", "has_topic", "field_of_study", 7_505_078),
    ),
    num_classes=349,
    split=(629_571, 64_879, 41_939),
    notes="paper features are 128-d in OGB; pass feature_dim=128 to mimic them on every node",
)

# ogbl-biokg [OGB]: disease 10,687, drug 10,533, function 45,085, protein 17,499, sideeffect 9,969
# (93,773 nodes), 51 relations, 4,762,678 training triples (the graph Hector loads).  Per-relation
# counts: the training triples of each canonical relation, as printed by PyG's loader of the OGB
# files (edge_reltype sizes); they sum to 4,762,678 exactly.  Link prediction: no node labels.
_BIOKG_RELATIONS = [
    ("disease", "disease-protein", "protein", 73_547),
    ("drug", "drug-disease", "disease", 5_147),
    ("drug", "drug-drug_acquired_metabolic_disease", "drug", 63_430),
    ("drug", "drug-drug_bacterial_infectious_disease", "drug", 18_554),
    ("drug", "drug-drug_benign_neoplasm", "drug", 30_348),
    ("drug", "drug-drug_cancer", "drug", 48_514),
    ("drug", "drug-drug_cardiovascular_system_disease", "drug", 94_842),
    ("drug", "drug-drug_chromosomal_disease", "drug", 316),
    ("drug", "drug-drug_cognitive_disorder", "drug", 34_660),
    ("drug", "drug-drug_cryptorchidism", "drug", 128),
    ("drug", "drug-drug_developmental_disorder_of_mental_health", "drug", 14_314),
    ("drug", "drug-drug_endocrine_system_disease", "drug", 55_994),
    ("drug", "drug-drug_fungal_infectious_disease", "drug", 36_114),
    ("drug", "drug-drug_gastrointestinal_system_disease", "drug", 83_210),
    ("drug", "drug-drug_hematopoietic_system_disease", "drug", 79_202),
    ("drug", "drug-drug_hematopoietic_system_diseases", "drug", 3_006),
    ("drug", "drug-drug_hypospadias", "drug", 292),
    ("drug", "drug-drug_immune_system_disease", "drug", 34_242),
    ("drug", "drug-drug_inherited_metabolic_disorder", "drug", 36_492),
    ("drug", "drug-drug_integumentary_system_disease", "drug", 73_902),
    ("drug", "drug-drug_irritable_bowel_syndrome", "drug", 8_528),
    ("drug", "drug-drug_monogenic_disease", "drug", 600),
    ("drug", "drug-drug_musculoskeletal_system_disease", "drug", 57_926),
    ("drug", "drug-drug_nervous_system_disease", "drug", 80_208),
    ("drug", "drug-drug_orofacial_cleft", "drug", 380),
    ("drug", "drug-drug_parasitic_infectious_disease", "drug", 1_680),
    ("drug", "drug-drug_personality_disorder", "drug", 972),
    ("drug", "drug-drug_polycystic_ovary_syndrome", "drug", 514),
    ("drug", "drug-drug_pre-malignant_neoplasm", "drug", 3_224),
    ("drug", "drug-drug_psoriatic_arthritis", "drug", 2_014),
    ("drug", "drug-drug_reproductive_system_disease", "drug", 17_006),
    ("drug", "drug-drug_respiratory_system_disease", "drug", 82_168),
    ("drug", "drug-drug_sexual_disorder", "drug", 1_260),
    ("drug", "drug-drug_sleep_disorder", "drug", 25_860),
    ("drug", "drug-drug_somatoform_disorder", "drug", 2_214),
    ("drug", "drug-drug_struct_sim", "drug", 26_348),
    ("drug", "drug-drug_substance-related_disorder", "drug", 4_392),
    ("drug", "drug-drug_thoracic_disease", "drug", 4_660),
    ("drug", "drug-drug_urinary_system_disease", "drug", 67_326),
    ("drug", "drug-drug_viral_infectious_disease", "drug", 38_846),
    ("drug", "drug-protein", "protein", 117_930),
    ("drug", "drug-sideeffect", "sideeffect", 157_479),
    ("function", "function-function", "function", 1_433_230),
    ("protein", "protein-function", "function", 777_577),
    ("protein", "protein-protein_activation", "protein", 73_044),
    ("protein", "protein-protein_binding", "protein", 292_254),
    ("protein", "protein-protein_catalysis", "protein", 303_434),
    ("protein", "protein-protein_expression", "protein", 1_952),
    ("protein", "protein-protein_inhibition", "protein", 25_732),
    ("protein", "protein-protein_ptmod", "protein", 15_120),
    ("protein", "protein-protein_reaction", "protein", 352_546),
]
BIOKG = Profile(
    name="biokg",
    source="ogbl-biokg (OGB), training graph",
    node_types=(
        NodeTypeSpec("disease", 10_687),
        NodeTypeSpec("drug", 10_533),
        NodeTypeSpec("function", 45_085),
        NodeTypeSpec("protein", 17_499),
        NodeTypeSpec("sideeffect", 9_969),
    ),
    relations=tuple(RelationSpec(*r) for r in _BIOKG_RELATIONS),
)

# ogbl-wikikg2 [OGB]: 2,500,604 entities (one node type), 535 relations, 16,109,182 training
# triples.  Per-relation counts are not recorded here: the total is split over the relations by a
# Zipf(1) law (r0 largest), so the breakdown is synthetic.
WIKIKG2 = Profile(
    name="wikikg2",
    source="ogbl-wikikg2 (OGB), training graph",
    node_types=(NodeTypeSpec("entity", 2_500_604),),
    relations=tuple(RelationSpec("entity", f"r{i}", "entity", c) for i, c in
                    enumerate(split_count(16_109_182, zipf_weights(535)))),
    breakdown="derived",
    notes="per-relation counts: Zipf(1) split of the published total",
)

# "fb15k" as Hector runs it [Hector]: dgl.data.FB15k237Dataset() with reverse=True, i.e.
# FB15k-237 (Toutanova & Chen 2015): 14,541 entities, 237 relations + 237 reverse = 474,
# train+valid+test triples 272,115 + 17,535 + 20,466 = 310,116, doubled = 620,232 edges.  The
# per-relation counts (train+valid+test) and the degree targets (largest in-degree 8,642, 21 nodes
# with in-degree >= 1000, counting the reverse edges) are computed from the real files [shared].
# (The original FB15k -- 14,951 entities, 1,345 relations, 483,142 training triples -- is not
# what Hector's "fb15k" loads.)
_FB15K237_RELATIONS = [
    ('/location/country/form_of_government', 369),
    ('/tv/tv_program/regular_cast./tv/regular_tv_appearance/actor', 1426),
    ('/media_common/netflix_genre/titles', 2901),
    ('/award/award_winner/awards_won./award/award_honor/award_winner', 8491),
    ('/soccer/football_team/current_roster./sports/sports_team_roster/position', 2279),
    ('/soccer/football_team/current_roster./soccer/football_roster_position/position', 2283),
    ('/film/actor/film./film/performance/film', 11045),
    ('/award/award_category/nominees./award/award_nomination/nominated_for', 11069),
    ('/award/award_nominee/award_nominations./award/award_nomination/award_nominee', 16391),
    ('/music/performance_role/regular_performances./music/group_membership/role', 2711),
    ('/award/award_category/winners./award/award_honor/ceremony', 3440),
    ('/film/film/release_date_s./film/film_regional_release_date/film_release_distribution_medium', 1749),
    ('/award/award_winning_work/awards_won./award/award_honor/award_winner', 3040),
    ('/film/film/release_date_s./film/film_regional_release_date/film_release_region', 15568),
    ('/film/film/language', 3125),
    ('/location/location/contains', 5834),
    ('/organization/organization/headquarters./location/mailing_address/country', 201),
    ('/people/person/profession', 13382),
    ('/location/statistical_region/religions./location/religion_percentage/religion', 726),
    ('/award/award_nominee/award_nominations./award/award_nomination/award', 14051),
    ('/music/genre/artists', 7134),
    ('/influence/influence_node/influenced_by', 2321),
    ('/education/educational_institution/students_graduates./education/education/student', 3229),
    ('/organization/organization_member/member_of./organization/organization_membership/organization', 977),
    ('/people/person/place_of_birth', 2783),
    ('/common/topic/webpage./common/webpage/category', 4364),
    ('/film/film/other_crew./film/film_crew_gig/film_crew_role', 6445),
    ('/award/award_ceremony/awards_presented./award/award_honor/award_winner', 3337),
    ('/film/film/country', 2673),
    ('/olympics/olympic_sport/athletes./olympics/olympic_athlete_affiliation/country', 2622),
    ('/award/award_winning_work/awards_won./award/award_honor/award', 3536),
    ('/film/film/genre', 8649),
    ('/film/film_distributor/films_distributed./film/film_film_distributor_relationship/film', 2643),
    ('/location/statistical_region/rent50_2./measurement_unit/dated_money_value/currency', 458),
    ('/film/film/estimated_budget./measurement_unit/dated_money_value/currency', 1471),
    ('/government/legislative_session/members./government/government_position_held/district_represented', 1310),
    ('/sports/sports_team/roster./american_football/football_historical_roster_position/position_s', 626),
    ('/government/government_office_category/officeholders./government/government_position_held/jurisdiction_of_office', 936),
    ('/award/award_nominee/award_nominations./award/award_nomination/nominated_for', 6483),
    ('/people/deceased_person/place_of_death', 834),
    ('/sports/pro_athlete/teams./sports/sports_team_roster/team', 710),
    ('/music/artist/track_contributions./music/track_contribution/role', 2040),
    ('/music/instrument/instrumentalists', 2227),
    ('/people/person/gender', 4530),
    ('/business/job_title/people_with_this_title./business/employment_tenure/company', 867),
    ('/base/popstra/celebrity/friendship./base/popstra/friendship/participant', 1573),
    ('/business/business_operation/industry', 404),
    ('/award/award_category/winners./award/award_honor/award_winner', 6070),
    ('/people/person/nationality', 5097),
    ('/sports/sports_team/roster./baseball/baseball_roster_position/position', 193),
    ('/people/cause_of_death/people', 895),
    ('/tv/tv_program/languages', 307),
    ('/music/genre/parent_genre', 851),
    ('/base/popstra/celebrity/breakup./base/popstra/breakup/participant', 153),
    ('/location/country/capital', 160),
    ('/film/special_film_performance_type/film_performance_type./film/performance/film', 113),
    ('/location/hud_county_place/place', 563),
    ('/music/performance_role/guest_performances./music/recording_contribution/performance_role', 499),
    ('/location/location/adjoin_s./location/adjoining_relationship/adjoins', 2157),
    ('/film/film_subject/films', 726),
    ('/base/schemastaging/person_extra/net_worth./measurement_unit/dated_money_value/currency', 583),
    ('/education/educational_institution/colors', 1013),
    ('/base/aareas/schema/administrative_area/administrative_parent', 619),
    ('/organization/role/leaders./organization/leadership/organization', 883),
    ('/government/legislative_session/members./government/government_position_held/legislative_sessions', 838),
    ('/olympics/olympic_games/sports', 685),
    ('/people/person/places_lived./people/place_lived/location', 4275),
    ('/award/award_category/disciplines_or_subjects', 240),
    ('/sports/professional_sports_team/draft_picks./sports/sports_league_draft_pick/school', 844),
    ('/olympics/olympic_participating_country/medals_won./olympics/olympic_medal_honor/olympics', 1269),
    ('/language/human_language/countries_spoken_in', 379),
    ('/people/ethnicity/people', 2483),
    ('/olympics/olympic_participating_country/athletes./olympics/olympic_athlete_affiliation/olympics', 821),
    ('/olympics/olympic_participating_country/medals_won./olympics/olympic_medal_honor/medal', 320),
    ('/film/film/other_crew./film/film_crew_gig/crewmember', 447),
    ('/music/performance_role/track_performances./music/track_contribution/role', 3887),
    ('/music/record_label/artist', 2744),
    ('/base/popstra/celebrity/dated./base/popstra/dated/participant', 1432),
    ('/base/locations/continents/countries_within', 134),
    ('/sports/sports_league_draft/picks./sports/sports_league_draft_pick/school', 337),
    ('/sports/sports_team/sport', 523),
    ('/education/educational_institution_campus/educational_institution', 552),
    ('/people/person/religion', 1337),
    ('/organization/organization/headquarters./location/mailing_address/citytown', 951),
    ('/film/film/produced_by', 1399),
    ('/people/person/spouse_s./people/marriage/type_of_union', 3557),
    ('/film/film/production_companies', 1734),
    ('/location/country/second_level_divisions', 541),
    ('/base/culturalevent/event/entity_involved', 316),
    ('/education/educational_degree/people_with_this_degree./education/education/institution', 2788),
    ('/film/film/distributors./film/film_film_distributor_relationship/film_distribution_medium', 344),
    ('/tv/tv_program/tv_producer./tv/tv_producer_term/producer_type', 147),
    ('/music/performance_role/regular_performances./music/group_membership/group', 1599),
    ('/government/politician/government_positions_held./government/government_position_held/legislative_sessions', 263),
    ('/sports/sports_team_location/teams', 419),
    ('/sports/sports_team/colors', 833),
    ('/sports/professional_sports_team/draft_picks./sports/sports_league_draft_pick/draft', 528),
    ('/award/award_nominated_work/award_nominations./award/award_nomination/nominated_for', 745),
    ('/baseball/baseball_team/team_stats./baseball/baseball_team_stats/season', 287),
    ('/user/alexander/philosophy/philosopher/interests', 123),
    ('/people/person/languages', 979),
    ('/education/educational_institution/students_graduates./education/education/major_field_of_study', 3219),
    ('/film/director/film', 886),
    ('/award/award_ceremony/awards_presented./award/award_honor/honored_for', 1144),
    ('/olympics/olympic_sport/athletes./olympics/olympic_athlete_affiliation/olympics', 397),
    ('/film/film/costume_design_by', 219),
    ('/film/film/featured_film_locations', 1185),
    ('/tv/tv_program/genre', 1183),
    ('/organization/endowed_organization/endowment./measurement_unit/dated_money_value/currency', 460),
    ('/film/film/written_by', 823),
    ('/tv/tv_producer/programs_produced./tv/tv_producer_term/producer_type', 266),
    ('/location/hud_county_place/county', 313),
    ('/education/educational_degree/people_with_this_degree./education/education/major_field_of_study', 618),
    ('/base/schemastaging/organization_extra/phone_number./base/schemastaging/phone_sandbox/contact_category', 179),
    ('/base/saturdaynightlive/snl_cast_member/seasons./base/saturdaynightlive/snl_season_tenure/cast_members', 104),
    ('/film/film/film_format', 421),
    ('/film/film/music', 1196),
    ('/sports/sports_team/roster./american_football/football_roster_position/position', 610),
    ('/user/tsegaran/random/taxonomy_subject/entry./user/tsegaran/random/taxonomy_entry/taxonomy', 493),
    ('/celebrities/celebrity/celebrity_friends./celebrities/friendship/friend', 252),
    ('/location/hud_foreclosure_area/estimated_number_of_mortgages./measurement_unit/dated_integer/source', 966),
    ('/base/x2010fifaworldcupsouthafrica/world_cup_squad/current_world_cup_squad./base/x2010fifaworldcupsouthafrica/current_world_cup_squad/current_club', 304),
    ('/base/popstra/location/vacationers./base/popstra/vacation_choice/vacationer', 426),
    ('/base/popstra/celebrity/canoodled./base/popstra/canoodled/participant', 453),
    ('/education/educational_institution/school_type', 883),
    ('/sports/sport/pro_athletes./sports/pro_sports_played/athlete', 164),
    ('/award/hall_of_fame/inductees./award/hall_of_fame_induction/inductee', 191),
    ('/base/biblioness/bibs_location/state', 314),
    ('/education/university/local_tuition./measurement_unit/dated_money_value/currency', 361),
    ('/business/business_operation/revenue./measurement_unit/dated_money_value/currency', 219),
    ('/sports/sports_position/players./sports/sports_team_roster/team', 3551),
    ('/military/military_conflict/combatants./military/military_combatant_group/combatants', 490),
    ('/sports/sports_league/teams./sports/sports_league_participation/team', 191),
    ('/base/biblioness/bibs_location/country', 628),
    ('/music/group_member/membership./music/group_membership/role', 809),
    ('/location/administrative_division/country', 391),
    ('/film/film/executive_produced_by', 803),
    ('/food/food/nutrients./food/nutrition_fact/nutrient', 1179),
    ('/music/group_member/membership./music/group_membership/group', 260),
    ('/location/statistical_region/gdp_nominal_per_capita./measurement_unit/dated_money_value/currency', 194),
    ('/education/field_of_study/students_majoring./education/education/student', 324),
    ('/award/award_winning_work/awards_won./award/award_honor/honored_for', 495),
    ('/sports/sports_team/roster./basketball/basketball_roster_position/position', 184),
    ('/organization/organization/headquarters./location/mailing_address/state_province_region', 800),
    ('/base/aareas/schema/administrative_area/capital', 137),
    ('/tv/tv_producer/programs_produced./tv/tv_producer_term/program', 425),
    ('/education/educational_institution/campuses', 559),
    ('/film/film/distributors./film/film_film_distributor_relationship/region', 178),
    ('/travel/travel_destination/climate./travel/travel_destination_monthly_climate/month', 652),
    ('/medicine/disease/notable_people_with_this_condition', 145),
    ('/base/schemastaging/organization_extra/phone_number./base/schemastaging/phone_sandbox/service_location', 414),
    ('/people/ethnicity/geographic_distribution', 153),
    ('/military/military_combatant/military_conflicts./military/military_combatant_group/combatants', 779),
    ('/film/film/personal_appearances./film/personal_film_appearance/person', 246),
    ('/location/location/time_zones', 1417),
    ('/film/film/story_by', 439),
    ('/base/petbreeds/city_with_dogs/top_breeds./base/petbreeds/dog_city_relationship/dog_breed', 235),
    ('/olympics/olympic_games/participating_countries', 536),
    ('/tv/tv_network/programs./tv/tv_network_duration/program', 358),
    ('/people/person/employment_history./business/employment_tenure/company', 361),
    ('/music/artist/origin', 609),
    ('/people/marriage_union_type/unions_of_this_type./people/marriage/location_of_ceremony', 528),
    ('/tv/tv_writer/tv_programs./tv/tv_program_writer_relationship/tv_program', 286),
    ('/time/event/locations', 429),
    ('/celebrities/celebrity/sexual_relationships./celebrities/romantic_relationship/celebrity', 236),
    ('/government/political_party/politicians_in_this_party./government/political_party_tenure/politician', 128),
    ('/education/university/domestic_tuition./measurement_unit/dated_money_value/currency', 481),
    ('/organization/non_profit_organization/registered_with./organization/non_profit_registration/registering_agency', 162),
    ('/user/ktrueman/default_domain/international_organization/member_states', 218),
    ('/american_football/football_team/current_roster./sports/sports_team_roster/position', 574),
    ('/soccer/football_player/current_team./sports/sports_team_roster/team', 552),
    ('/olympics/olympic_games/medals_awarded./olympics/olympic_medal_honor/medal', 129),
    ('/award/ranked_item/appears_in_ranked_lists./award/ranking/list', 426),
    ('/film/film_set_designer/film_sets_designed', 129),
    ('/user/jg/default_domain/olympic_games/sports', 599),
    ('/people/person/sibling_s./people/sibling_relationship/sibling', 143),
    ('/base/marchmadness/ncaa_basketball_tournament/seeds./base/marchmadness/ncaa_tournament_seed/team', 426),
    ('/music/artist/contribution./music/recording_contribution/performance_role', 241),
    ('/sports/sports_position/players./sports/sports_team_roster/position', 125),
    ('/government/politician/government_positions_held./government/government_position_held/basic_title', 136),
    ('/sports/sports_position/players./american_football/football_historical_roster_position/position_s', 102),
    ('/people/profession/specialization_of', 125),
    ('/award/award_category/category_of', 181),
    ('/film/film/cinematography', 373),
    ('/film/film/film_production_design_by', 182),
    ('/tv/tv_program/country_of_origin', 322),
    ('/film/film/edited_by', 200),
    ('/tv/tv_personality/tv_regular_appearances./tv/tv_regular_personal_appearance/program', 123),
    ('/education/field_of_study/students_majoring./education/education/major_field_of_study', 361),
    ('/education/educational_degree/people_with_this_degree./education/education/student', 322),
    ('/location/us_county/county_seat', 184),
    ('/film/film/film_festivals', 298),
    ('/people/person/spouse_s./people/marriage/spouse', 437),
    ('/film/film/runtime./film/film_cut/film_release_region', 200),
    ('/location/capital_of_administrative_division/capital_of./location/administrative_division_capital_relationship/administrative_division', 296),
    ('/base/aareas/schema/administrative_area/administrative_area_type', 191),
    ('/influence/influence_node/peers./influence/peer_relationship/peers', 168),
    ('/government/governmental_body/members./government/government_position_held/legislative_sessions', 121),
    ('/base/schemastaging/organization_extra/phone_number./base/schemastaging/phone_sandbox/service_language', 244),
    ('/organization/organization/place_founded', 133),
    ('/base/eating/practicer_of_diet/diet', 165),
    ('/tv/tv_program/program_creator', 149),
    ('/people/deceased_person/place_of_burial', 166),
    ('/film/film/release_date_s./film/film_regional_release_date/film_regional_debut_venue', 282),
    ('/ice_hockey/hockey_team/current_roster./sports/sports_team_roster/position', 128),
    ('/location/administrative_division/first_level_division_of', 141),
    ('/location/statistical_region/gdp_real./measurement_unit/adjusted_money_value/adjustment_currency', 160),
    ('/organization/organization/child./organization/organization_relationship/child', 231),
    ('/business/business_operation/assets./measurement_unit/dated_money_value/currency', 182),
    ('/film/person_or_entity_appearing_in_film/films./film/personal_film_appearance/type_of_appearance', 45),
    ('/time/event/instance_of_recurring_event', 134),
    ('/tv/non_character_role/tv_regular_personal_appearances./tv/tv_regular_personal_appearance/person', 104),
    ('/film/actor/film./film/performance/special_performance_type', 204),
    ('/business/business_operation/operating_income./measurement_unit/dated_money_value/currency', 199),
    ('/people/ethnicity/languages_spoken', 242),
    ('/base/americancomedy/celebrity_impressionist/celebrities_impersonated', 150),
    ('/medicine/symptom/symptom_of', 197),
    ('/education/university/fraternities_and_sororities', 162),
    ('/location/statistical_region/places_exported_to./location/imports_and_exports/exported_to', 202),
    ('/location/statistical_region/gdp_nominal./measurement_unit/dated_money_value/currency', 233),
    ('/travel/travel_destination/how_to_get_here./travel/transportation/mode_of_transportation', 182),
    ('/location/country/official_language', 248),
    ('/location/location/partially_contains', 154),
    ('/film/film/film_art_direction_by', 108),
    ('/people/person/spouse_s./people/marriage/location_of_ceremony', 307),
    ('/education/university/international_tuition./measurement_unit/dated_money_value/currency', 119),
    ('/organization/organization_founder/organizations_founded', 157),
    ('/film/film/dubbing_performances./film/dubbing_performance/actor', 141),
    ('/dataworld/gardening_hint/split_to', 113),
    ('/medicine/disease/risk_factors', 194),
    ('/film/film/prequel', 211),
    ('/base/localfood/seasonal_month/produce_available./base/localfood/produce_availability/seasonal_months', 114),
    ('/film/actor/dubbing_performances./film/dubbing_performance/language', 139),
    ('/broadcast/content/artist', 127),
    ('/location/statistical_region/gni_per_capita_in_ppp_dollars./measurement_unit/dated_money_value/currency', 149),
    ('/music/instrument/family', 109),
    ('/government/politician/government_positions_held./government/government_position_held/jurisdiction_of_office', 121),
]
FB15K = Profile(
    name="fb15k",
    source="FB15k-237 via dgl.data.FB15k237Dataset (reverse=True), as loaded by Hector",
    node_types=(NodeTypeSpec("entity", 14_541, max_degree=8_642, super_nodes=21),),
    relations=_with_reverse([("entity", r, "entity", c) for r, c in _FB15K237_RELATIONS]),
    notes="relation ids follow first appearance in train.txt; reverse relations are rev-<name>",
)

# AIFB as dgl.data.AIFBDataset builds it [DGL-RDF]: 7,262 nodes, 48,810 edges including reverse,
# 7 node types, 52 canonical relations + 52 reverse = 104 [Hector]; target Personen, 4 classes,
# 140 train / 36 test.  The per-type node counts, per-relation edge counts and per-type largest
# in-degrees are computed from ../shared/data/aifb with DGL's parsing rules [shared] ('type' is
# renamed 'rdftype' as DGL does).  No node features.
_AIFB_RELATIONS = [
    ('Forschungsgebiete', 'ontology#dealtWithIn', 'Projekte', 357),
    ('Forschungsgebiete', 'ontology#isWorkedOnBy', 'Personen', 571),
    ('Forschungsgebiete', 'ontology#name', '_Literal', 146),
    ('Forschungsgebiete', 'rdftype', '_Literal', 129),
    ('Forschungsgruppen', 'ontology#carriesOut', 'Projekte', 79),
    ('Forschungsgruppen', 'ontology#head', 'Personen', 5),
    ('Forschungsgruppen', 'ontology#homepage', '_Literal', 5),
    ('Forschungsgruppen', 'ontology#member', 'Personen', 74),
    ('Forschungsgruppen', 'ontology#name', '_Literal', 5),
    ('Forschungsgruppen', 'ontology#publishes', 'Publikationen', 1217),
    ('Kooperationen', 'ontology#finances', 'Projekte', 68),
    ('Kooperationen', 'ontology#name', '_Literal', 28),
    ('Personen', 'ontology#fax', '_Literal', 227),
    ('Personen', 'ontology#name', '_Literal', 227),
    ('Personen', 'ontology#phone', '_Literal', 227),
    ('Personen', 'ontology#publication', 'Publikationen', 2609),
    ('Personen', 'ontology#homepage', '_Literal', 78),
    ('Personen', 'ontology#photo', '_Literal', 148),
    ('Personen', 'ontology#worksAtProject', 'Projekte', 200),
    ('Projekte', 'ontology#carriedOutBy', 'Forschungsgruppen', 79),
    ('Projekte', 'ontology#financedBy', 'Kooperationen', 65),
    ('Projekte', 'ontology#homepage', '_Literal', 57),
    ('Projekte', 'ontology#isAbout', 'Forschungsgebiete', 357),
    ('Projekte', 'ontology#member', 'Personen', 265),
    ('Projekte', 'ontology#name', '_Literal', 75),
    ('Projekte', 'ontology#projectInfo', 'Publikationen', 952),
    ('Publikationen', 'ontology#homepage', '_Literal', 99),
    ('Publikationen', 'ontology#name', '_Literal', 821),
    ('Publikationen', 'ontology#publication', 'Publikationen', 1554),
    ('Publikationen', 'ontology#abstract', '_Literal', 534),
    ('Publikationen', 'ontology#author', 'Personen', 2550),
    ('Publikationen', 'ontology#booktitle', '_Literal', 765),
    ('Publikationen', 'ontology#hasProject', 'Projekte', 952),
    ('Publikationen', 'ontology#isAbout', 'Forschungsgebiete', 2120),
    ('Publikationen', 'ontology#title', '_Literal', 1227),
    ('Publikationen', 'ontology#year', '_Literal', 1227),
    ('Publikationen', 'ontology#journal', '_Literal', 161),
    ('Publikationen', 'ontology#month', '_Literal', 759),
    ('Publikationen', 'ontology#number', '_Literal', 145),
    ('Publikationen', 'ontology#pages', '_Literal', 548),
    ('Publikationen', 'ontology#address', '_Literal', 202),
    ('Publikationen', 'ontology#author', 'Publikationen', 1436),
    ('Publikationen', 'ontology#series', '_Literal', 298),
    ('Publikationen', 'ontology#volume', '_Literal', 311),
    ('Publikationen', 'ontology#editor', 'Personen', 81),
    ('Publikationen', 'ontology#editor', 'Publikationen', 109),
    ('Publikationen', 'ontology#note', '_Literal', 114),
    ('Publikationen', 'ontology#howpublished', '_Literal', 49),
    ('Publikationen', 'ontology#type', '_Literal', 50),
    ('Publikationen', 'ontology#isbn', '_Literal', 16),
    ('Publikationen', 'ontology#chapter', '_Literal', 15),
    ('Publikationen', 'ontology#edition', '_Literal', 12),
]
AIFB = Profile(
    name="aifb",
    source="AIFB via dgl.data.AIFBDataset (insert_reverse=True)",
    node_types=(
        NodeTypeSpec("Personen", 237, max_degree=467),
        NodeTypeSpec("Forschungsgebiete", 146, max_degree=319),
        NodeTypeSpec("Projekte", 78, max_degree=354),
        NodeTypeSpec("_Literal", 5_450, max_degree=237),
        NodeTypeSpec("Forschungsgruppen", 5, max_degree=991),
        NodeTypeSpec("Publikationen", 1_318, max_degree=88),
        NodeTypeSpec("Kooperationen", 28, max_degree=27),
    ),
    relations=_with_reverse(_AIFB_RELATIONS),
    num_classes=4,
    split=(140, 0, 36),
)

# MUTAG as dgl.data.MUTAGDataset builds it [DGL-RDF]: 27,163 nodes, 148,100 edges including
# reverse (74,050 forward), 5 node types, 25 canonical relations + reverse = 50 [Hector]; target
# 'd', 2 classes, 272 train / 68 test.  Breakdown derived (see _derived_rdf).
_types, _fwd = _derived_rdf("mutag", 27_163, 5, "d", 25, 74_050)
MUTAG = Profile(
    name="mutag", source="MUTAG via dgl.data.MUTAGDataset (insert_reverse=True)",
    node_types=_types, relations=_with_reverse(_fwd), num_classes=2, split=(272, 0, 68),
    breakdown="derived", notes="totals published; per-type/per-relation breakdown synthetic")

# BGS as dgl.data.BGSDataset builds it [DGL-RDF]: 94,806 nodes, 672,884 edges including reverse
# (336,442 forward), 27 node types, 61 canonical relations + reverse = 122 [Hector]; target
# 'Lexicon/NamedRockUnit', 2 classes, 117 train / 29 test.  Breakdown derived.
_types, _fwd = _derived_rdf("bgs", 94_806, 27, "Lexicon/NamedRockUnit", 61, 336_442)
BGS = Profile(
    name="bgs", source="BGS via dgl.data.BGSDataset (insert_reverse=True)",
    node_types=_types, relations=_with_reverse(_fwd), num_classes=2, split=(117, 0, 29),
    breakdown="derived", notes="totals published; per-type/per-relation breakdown synthetic")

# AM as dgl.data.AMDataset builds it [DGL-RDF]: 881,680 nodes, 5,668,682 edges including reverse
# (2,834,341 forward), 7 node types, 54 canonical relations + reverse = 108 [Hector]; target
# 'proxy', 11 classes, 802 train / 198 test.  Breakdown derived.
_types, _fwd = _derived_rdf("am", 881_680, 7, "proxy", 54, 2_834_341)
AM = Profile(
    name="am", source="AM via dgl.data.AMDataset (insert_reverse=True)",
    node_types=_types, relations=_with_reverse(_fwd), num_classes=11, split=(802, 0, 198),
    breakdown="derived", notes="totals published; per-type/per-relation breakdown synthetic")
del _types, _fwd


# ---------------------------------------------------------------------------------------------
# Homogeneous profiles (the DF-GNN paper's datasets): one node type, one relation
# ---------------------------------------------------------------------------------------------

def _homogeneous(name: str, source: str, nodes: int, edges: int, *, symmetric: bool,
                 feature_dim: int, num_classes: int, split, max_degree: Optional[int],
                 multilabel: bool = False, notes: str = "") -> Profile:
    return Profile(
        name=name, source=source,
        node_types=(NodeTypeSpec("node", nodes, max_degree=max_degree),),
        relations=(RelationSpec("node", "edge", "node", edges),),
        feature_dim=feature_dim, num_classes=num_classes, multilabel=multilabel,
        symmetric=symmetric, split=split, notes=notes)


# Cora [Planetoid]: 2,708 nodes, 10,556 directed edges (5,278 undirected, both directions),
# 1,433 features, 7 classes, split 140 / 500 / 1,000; max degree 168 [shared].
CORA = _homogeneous("cora", "Cora (Planetoid)", 2_708, 10_556, symmetric=True, feature_dim=1_433,
                    num_classes=7, split=(140, 500, 1_000), max_degree=168)

# PubMed [Planetoid]: 19,717 nodes, 88,648 directed edges (44,324 undirected), 500 features,
# 3 classes, split 60 / 500 / 1,000; max degree 171 (as commonly reported; not re-measured here).
PUBMED = _homogeneous("pubmed", "PubMed (Planetoid)", 19_717, 88_648, symmetric=True,
                      feature_dim=500, num_classes=3, split=(60, 500, 1_000), max_degree=171)

# ogbn-arxiv [OGB]: 169,343 nodes, 1,166,243 directed citation edges.  NOT symmetrised (as OGB
# distributes it; PyG examples often symmetrise it to 2,315,598).  128 features, 40 classes, time
# split 90,941 / 29,799 / 48,603.  Max in-degree ~13,155 (recalled from the literature, approximate).
ARXIV = _homogeneous("arxiv", "ogbn-arxiv (OGB), directed", 169_343, 1_166_243, symmetric=False,
                     feature_dim=128, num_classes=40, split=(90_941, 29_799, 48_603),
                     max_degree=13_155, notes="directed (not symmetrised)")

# ogbn-proteins [OGB]: 132,534 nodes, 39,561,252 undirected edges = 79,122,504 directed, 112
# binary tasks (multi-label), species split 86,619 / 21,236 / 24,679.  OGB has no node features,
# only 8-d edge features; feature_dim 8 mimics the usual practice of aggregating them to nodes.
# Max degree 7,750 (as reported in the literature; not re-measured here).
PROTEINS = _homogeneous("proteins", "ogbn-proteins (OGB)", 132_534, 79_122_504, symmetric=True,
                        feature_dim=8, num_classes=112, multilabel=True,
                        split=(86_619, 21_236, 24_679), max_degree=7_750,
                        notes="y is [N, 112] in {0, 1}")

# Reddit [Reddit] as in PyG/DGL: 232,965 nodes, 114,615,892 directed edges (mean degree ~492),
# 602 features, 41 classes, split 153,431 / 23,831 / 55,703.  Max degree 21,657 (as commonly
# reported; not re-measured here).
REDDIT = _homogeneous("reddit", "Reddit (GraphSAGE), as in PyG/DGL", 232_965, 114_615_892,
                      symmetric=True, feature_dim=602, num_classes=41,
                      split=(153_431, 23_831, 55_703), max_degree=21_657)

# ogbn-products [OGB]: 2,449,029 nodes, 61,859,140 undirected edges = 123,718,280 directed, 100
# features, 47 classes, sales-rank split 196,615 / 39,323 / 2,213,091.  Max degree 17,481
# (recalled from the literature, approximate).
PRODUCTS = _homogeneous("products", "ogbn-products (OGB)", 2_449_029, 123_718_280,
                        symmetric=True, feature_dim=100, num_classes=47,
                        split=(196_615, 39_323, 2_213_091), max_degree=17_481)


PROFILES: Dict[str, Profile] = {p.name: _check_profile(p) for p in (
    AIFB, MUTAG, BGS, AM, FB15K, BIOKG, WIKIKG2, MAG,
    CORA, PUBMED, ARXIV, PROTEINS, REDDIT, PRODUCTS,
)}


def get(name: str) -> Profile:
    """The profile called ``name``; ValueError listing the known names otherwise."""
    if not isinstance(name, str):
        raise TypeError(f"profile must be a str or a Profile, got {type(name).__name__}")
    try:
        return PROFILES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown synthetic profile {name!r}; known profiles: "
                         f"{', '.join(PROFILES)}") from None
